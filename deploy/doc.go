// Package deploy holds what runs mdag outside this repository: the Grafana
// dashboard (deploy/grafana/mdag.json), the Kubernetes manifests
// (deploy/kubernetes: the base in static mode, the provisioned overlay, the
// optional monitoring objects and the GKE overlay) and the Helm chart that
// makes the same objects (deploy/helm/mdag); docs/deploy.md says how to use
// them.
//
// It has no Go code of its own. Its tests decode every manifest strictly into
// its Kubernetes type (k8s.io/api, the Prometheus operator's ServiceMonitor, a
// mirror of kustomize's Kustomization) and check that the manifests agree
// with each other, with the deployed app's profiles, with the mdag CLI's
// flags and with the torch runner's: a misspelt field, a worker Deployment
// that breaks the conventions the kubernetes provisioner relies on, a Service
// that selects no pod or a flag the binary does not have fails them. They
// also hold the guards (security_test.go): RBAC and an API token only in
// provisioned mode, Pod Security Admission's restricted profile on the
// namespace and every pod template, NetworkPolicies admitting exactly who
// may reach each port, and images pinned to a build.
//
// The chart (helm_test.go) is rendered with Helm's own packages
// (helm.sh/helm/v3: loader, values and values.schema.json, the template
// engine) for its defaults, values-gke.yaml, the provisioner and
// monitoring; each rendering decodes strictly, passes the same checks, and
// equals the matching kustomization object by object, as rendered by the
// tests' own kustomize renderer (kustomizebuild_test.go, compared with
// kubectl kustomize where kubectl is installed). Wrong values must fail
// naming the value, and every value must be used.
//
// The ConfigMaps and chart files that copy a file of the repository (the
// traffic app and its profiles, the Grafana dashboard, the model registry)
// are generated from it: go test ./deploy -update writes them again, and the
// test fails while they differ.
package deploy
