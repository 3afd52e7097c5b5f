// Package kube is the coordinator's `kubernetes` Provisioner: placement's
// instance starts and stops become worker pods of the right type.
//
// Each worker type has a Deployment in the namespace (label
// mdag.io/worker-type=<type>, usually scaled to 0: static mode); Start
// creates a bare pod from its pod template, named
// mdag-worker-<type lowercased>-<instance id as DNS-1123>, labelled as the
// template with mdag.io/pool=provisioned (so the Deployment's selector,
// which carries mdag.io/pool=static, never adopts it) and
// mdag.io/instance=<id>, with env MDAG_WORKER_ID=<id> on container
// "worker". The pod's worker registers over gRPC under that ID, which binds
// it to the planned instance (coordinator.Pending). Release deletes the
// pod. A watch on the provisioned pods reports a pod deleted, failed or
// finished behind the coordinator's back as a lost instance
// (Engine.LostInstance); registration over gRPC, not pod readiness, is
// what makes an instance up.
//
// With an Issuer (Config.Issuer: a CA's certificate and key) each pod gets
// a worker certificate of its own, mdag://worker/<instance id>: Start
// issues it, creates the pod (its template's worker TLS volume, the one of
// Secret mdag-worker-tls, now naming Secret <pod name>-tls), then that
// Secret (ca.pem, worker.pem, worker-key.pem: the layout --tls-dir reads)
// owned by the pod, so that deleting the pod garbage-collects it; the
// kubelet retries the pod's missing volume until the Secret exists. The
// worker's ID (MDAG_WORKER_ID) is its certificate's name, so the
// coordinator needs no --shared-cert for these pods and a certificate
// registers only its own instance. Certificates are renewed (the Secret
// updated: the kubelet refreshes the files and the worker re-reads them)
// once two thirds of their validity (Config.CertValid) has passed. Release
// deletes the Secret too, and New deletes the per-pod Secrets a previous
// coordinator left. Without an Issuer every pod mounts the template's
// shared certificate, as the Deployment does in static mode.
package kube

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	appsv1client "k8s.io/client-go/kubernetes/typed/apps/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/defaults"
	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/worker"
)

// The labels of the conventions (deploy/ writes the Deployments).
const (
	LabelName       = "app.kubernetes.io/name"
	LabelType       = "mdag.io/worker-type"
	LabelPool       = "mdag.io/pool"
	LabelInstance   = "mdag.io/instance"
	PoolProvisioned = "provisioned"
	WorkerName      = "mdag-worker"
	WorkerContainer = "worker"
	EnvWorkerID     = "MDAG_WORKER_ID"
	// WorkerTLSSecret is the Secret of the worker certificate the worker
	// Deployments mount (shared by every pod of static mode); with an
	// Issuer, the template's volume of it is what each pod's own Secret
	// replaces.
	WorkerTLSSecret = "mdag-worker-tls"
	// AnnotationCert and AnnotationNotAfter, on a per-pod Secret: the
	// certificate's identity and expiry (RFC 3339), for kubectl.
	AnnotationCert     = "mdag.io/cert"
	AnnotationNotAfter = "mdag.io/cert-not-after"
)

// DefaultCertValid is the validity of the certificates the provisioner
// issues when Config.CertValid is 0: short, since a pod lives only as long
// as the plan keeps its instance (and one that lives longer has its
// certificate renewed after two thirds of it).
const DefaultCertValid = 30 * 24 * time.Hour

// The files of a per-pod Secret: what --tls-dir reads for role worker.
const (
	secretCA   = pki.CAFile
	secretCert = string(pki.Worker) + ".pem"
	secretKey  = string(pki.Worker) + "-key.pem"
)

// Issuer is the CA that signs each provisioned pod's worker certificate.
type Issuer struct {
	CA *pki.CA
	// Trust is the PEM each pod gets as its ca.pem: what its worker checks
	// the coordinator's certificate against (the issuer's ca.pem file,
	// which may hold more than the issuing CA during a CA rotation).
	Trust []byte
}

// DefaultLimit is each worker type's pod limit when Config.Limits is nil:
// every type with a worker Deployment in the namespace at New may have
// this many provisioned pods.
const DefaultLimit = 4

// Losses is where pod losses go: the coordinator.Engine.
type Losses interface {
	LostInstance(id, why string)
}

// Client is the part of the API the provisioner uses: pods and
// Deployments. A kubernetes.Interface (client-go's Clientset, or its fake)
// is one; NewClient makes the smaller one the binary links.
type Client interface {
	CoreV1() corev1client.CoreV1Interface
	AppsV1() appsv1client.AppsV1Interface
}

// typed is a Client of the two typed clients alone.
type typed struct {
	core corev1client.CoreV1Interface
	apps appsv1client.AppsV1Interface
}

func (t typed) CoreV1() corev1client.CoreV1Interface { return t.core }
func (t typed) AppsV1() appsv1client.AppsV1Interface { return t.apps }

// NewClient is a Client for the API server of rc with only the core and
// apps typed clients (client-go's whole Clientset would link every API
// group into the binary).
func NewClient(rc *rest.Config) (Client, error) {
	core, err := corev1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: core/v1 client: %w", err)
	}
	apps, err := appsv1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: apps/v1 client: %w", err)
	}
	return typed{core: core, apps: apps}, nil
}

// Config configures a Provisioner.
type Config struct {
	Client    Client
	Namespace string // default "mdag"
	// Limits is the most pods per worker type; nil: DefaultLimit for each
	// type with a worker Deployment at New (a type absent has none).
	Limits map[profile.WorkerTypeID]int
	Clock  clock.Clock  // default clock.Real (the watch's restart backoff)
	Log    *slog.Logger // default discards
	// CallTimeout bounds each API call (Start and Release run on the
	// engine's loop); default 10 s.
	CallTimeout time.Duration
	// Issuer, when set, gives each pod a certificate of its own (the
	// package comment); nil: the pods share the template's.
	Issuer *Issuer
	// CertValid is how long an issued certificate is valid (never beyond
	// the issuer's CA); default DefaultCertValid.
	CertValid time.Duration
}

// Provisioner implements coordinator.Provisioner over Kubernetes pods.
type Provisioner struct {
	cfg    Config
	limits map[profile.WorkerTypeID]int

	mu   sync.Mutex
	pods map[string]*pod // instance id -> its pod

	stop context.CancelFunc
	wg   sync.WaitGroup // the watch and the renewals
}

type pod struct {
	name string
	typ  profile.WorkerTypeID
	uid  string
	lost bool // reported to the engine
	up   bool // seen ready (logged once)
	// With an Issuer: the pod's Secret and when its certificate is due
	// for renewal.
	secret  string
	renewAt time.Time
}

// New returns a Provisioner. It deletes, at once (grace period 0), the
// provisioned pods a previous coordinator left (label
// mdag.io/pool=provisioned), rather than adopt them: this coordinator
// starts with no instance planned (its saved state keeps none of them),
// so each would be a worker no plan counts on, holding a node; the plan
// starts what it needs. Errors from the API server are returned.
func New(ctx context.Context, cfg Config) (*Provisioner, error) {
	if cfg.Client == nil {
		return nil, errors.New("kube: Config.Client is nil")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "mdag"
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c := defaults.Fields{Prefix: "kube.Config"}
	c.Duration("CallTimeout", &cfg.CallTimeout, 10*time.Second)
	c.Duration("CertValid", &cfg.CertValid, DefaultCertValid)
	if err := c.Err(); err != nil {
		return nil, err
	}
	if cfg.Issuer != nil && (cfg.Issuer.CA == nil || cfg.Issuer.CA.Cert == nil || cfg.Issuer.CA.Key == nil) {
		return nil, errors.New("kube: Config.Issuer has no CA certificate and key")
	}
	p := &Provisioner{cfg: cfg, pods: map[string]*pod{}, limits: maps.Clone(cfg.Limits)}
	if p.limits == nil {
		p.limits = map[profile.WorkerTypeID]int{}
		ds, err := cfg.Client.AppsV1().Deployments(cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelType})
		if err != nil {
			return nil, fmt.Errorf("kube: list worker Deployments in namespace %s: %w", cfg.Namespace, err)
		}
		for _, d := range ds.Items {
			p.limits[profile.WorkerTypeID(d.Labels[LabelType])] = DefaultLimit
		}
	}
	old, err := cfg.Client.CoreV1().Pods(cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelPool + "=" + PoolProvisioned})
	if err != nil {
		return nil, fmt.Errorf("kube: list leftover provisioned pods in namespace %s: %w", cfg.Namespace, err)
	}
	now := int64(0) // at once: they serve nothing, and this run's first pods may take their names
	for _, o := range old.Items {
		err := cfg.Client.CoreV1().Pods(cfg.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{GracePeriodSeconds: &now})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kube: delete leftover provisioned pod %s/%s: %w", cfg.Namespace, o.Name, err)
		}
		cfg.Log.Warn("deleted a provisioned worker pod a previous coordinator left (this one starts what its plan needs)",
			"pod", o.Name, "instance", o.Labels[LabelInstance], "type", o.Labels[LabelType])
	}
	if err := p.deleteLeftoverSecrets(ctx); err != nil {
		return nil, err
	}
	if cfg.Issuer == nil {
		cfg.Log.Warn("PROVISIONED WORKERS SHARE ONE CERTIFICATE: every worker pod mounts the template's Secret "+WorkerTLSSecret+
			", so any holder of it may register as any worker ID the coordinator's --shared-cert allows, and the per-certificate registration limit is the whole fleet's; "+
			"give the coordinator --provisioner-issuer (a CA it issues each pod a certificate of its own with: docs/deploy.md)",
			"namespace", cfg.Namespace)
	} else {
		cfg.Log.Info("provisioned workers get a certificate of their own", "issuer", cfg.Issuer.CA.Cert.Subject.CommonName,
			"valid", cfg.CertValid, "ca_expires", cfg.Issuer.CA.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	return p, nil
}

// deleteLeftoverSecrets deletes the per-pod certificate Secrets (label
// mdag.io/pool=provisioned) a previous coordinator left: their pods are
// gone (New deleted them) and the garbage collector would delete them
// too, but not at once nor where it is off. Without an Issuer, a Role
// that grants nothing on Secrets is no error.
func (p *Provisioner) deleteLeftoverSecrets(ctx context.Context) error {
	cfg := p.cfg
	old, err := cfg.Client.CoreV1().Secrets(cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelPool + "=" + PoolProvisioned})
	if err != nil {
		if cfg.Issuer == nil && apierrors.IsForbidden(err) {
			cfg.Log.Debug("not allowed to list Secrets: no per-pod certificate Secrets to clean up", "err", err)
			return nil
		}
		return fmt.Errorf("kube: list leftover per-pod certificate Secrets in namespace %s: %w", cfg.Namespace, err)
	}
	for _, o := range old.Items {
		if o.Labels[LabelPool] != PoolProvisioned { // a fake or an old server may not filter
			continue
		}
		err := cfg.Client.CoreV1().Secrets(cfg.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("kube: delete leftover per-pod certificate Secret %s/%s: %w", cfg.Namespace, o.Name, err)
		}
		cfg.Log.Info("deleted a per-pod certificate Secret a previous coordinator left", "secret", o.Name, "instance", o.Labels[LabelInstance])
	}
	return nil
}

// Limits implements coordinator.Provisioner.
func (p *Provisioner) Limits() map[profile.WorkerTypeID]int { return maps.Clone(p.limits) }

// Start implements coordinator.Provisioner: it creates instance id's pod
// from type typ's worker Deployment and returns a coordinator.Pending
// instance (the worker registering binds it). With an Issuer it issues the
// pod's certificate first and creates its Secret after the pod (owned by
// it); a Secret that cannot be made deletes the pod again.
func (p *Provisioner) Start(id string, typ profile.WorkerTypeID) (coordinator.Instance, error) {
	p.mu.Lock()
	n := 0
	for _, q := range p.pods {
		if q.typ == typ {
			n++
		}
	}
	_, dup := p.pods[id]
	p.mu.Unlock()
	if dup {
		return nil, fmt.Errorf("kube: instance %s already has a pod", id)
	}
	if n >= p.limits[typ] {
		return nil, fmt.Errorf("kube: %s limit of %d pods reached", typ, p.limits[typ])
	}
	var cert *issued
	if p.cfg.Issuer != nil {
		// The worker registers under MDAG_WORKER_ID = id, and the
		// coordinator accepts from a certificate only its own name: the
		// name is the ID. Placement's IDs are TYPE-N, and a type with a
		// Deployment is a label value, so only a type of over 60
		// characters fails here.
		if err := pki.CheckName(id); err != nil {
			return nil, fmt.Errorf("kube: instance %s: not a certificate name, so its pod cannot have a certificate of its own (a shorter worker type name fixes it): %w", id, err)
		}
		var err error
		if cert, err = p.issue(id); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.CallTimeout)
	defer cancel()
	po, err := p.podFor(ctx, id, typ)
	if err != nil {
		return nil, err
	}
	made, err := p.cfg.Client.CoreV1().Pods(p.cfg.Namespace).Create(ctx, po, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("kube: create pod %s/%s for instance %s: a pod of that name exists (an earlier one still terminating, or not this coordinator's: delete it); the next plan retries", p.cfg.Namespace, po.Name, id)
	}
	if err != nil {
		return nil, fmt.Errorf("kube: create pod %s/%s for instance %s: %w", p.cfg.Namespace, po.Name, id, err)
	}
	q := &pod{name: made.Name, typ: typ, uid: string(made.UID)}
	if cert != nil {
		q.secret = SecretName(made.Name)
		if err := p.writeSecret(ctx, id, q, cert, true); err != nil {
			now := int64(0) // its volume would never appear
			dctx, dcancel := context.WithTimeout(context.Background(), p.cfg.CallTimeout)
			defer dcancel()
			if derr := p.cfg.Client.CoreV1().Pods(p.cfg.Namespace).Delete(dctx, made.Name, metav1.DeleteOptions{GracePeriodSeconds: &now}); derr != nil && !apierrors.IsNotFound(derr) {
				p.cfg.Log.Error("deleting a worker pod whose certificate Secret could not be made failed (delete it by hand; the next coordinator deletes it at start)",
					"pod", made.Name, "instance", id, "err", derr)
			}
			return nil, err
		}
		q.renewAt = cert.renewAt
	}
	p.mu.Lock()
	p.pods[id] = q
	p.mu.Unlock()
	if cert != nil {
		p.cfg.Log.Info("worker pod created", "pod", made.Name, "instance", id, "type", typ, "secret", q.secret, "cert", pki.IdentityURI(pki.Worker, id).String(),
			"cert_expires", cert.notAfter.UTC().Format(time.RFC3339))
	} else {
		p.cfg.Log.Info("worker pod created", "pod", made.Name, "instance", id, "type", typ)
	}
	return pending{}, nil
}

// issued is a certificate the provisioner made, as a Secret's files.
type issued struct {
	name              string // mdag://worker/NAME
	certPEM, keyPEM   []byte
	notAfter, renewAt time.Time
}

// issue signs instance id's worker certificate, valid from the clock's now
// for CertValid (never beyond the CA), renewed after two thirds of that.
func (p *Provisioner) issue(id string) (*issued, error) {
	now := p.cfg.Clock.Now()
	c, err := p.cfg.Issuer.CA.Issue(pki.Request{Role: pki.Worker, Name: id, Now: now, Valid: p.cfg.CertValid})
	if err != nil {
		return nil, fmt.Errorf("kube: issue instance %s's worker certificate: %w", id, err)
	}
	key, err := pki.KeyPEM(c.Key)
	if err != nil {
		return nil, fmt.Errorf("kube: instance %s's worker key: %w", id, err)
	}
	return &issued{name: id, certPEM: pki.CertPEM(c.Cert), keyPEM: key, notAfter: c.Cert.NotAfter,
		renewAt: now.Add(c.Cert.NotAfter.Sub(now) * 2 / 3)}, nil
}

// SecretName is the per-pod certificate Secret of pod podName.
func SecretName(podName string) string { return podName + "-tls" }

// secretFor is q's certificate Secret, owned by the pod (its UID: deleting
// the pod deletes it).
func (p *Provisioner) secretFor(id string, q *pod, cert *issued) *corev1.Secret {
	labels := map[string]string{LabelName: WorkerName, LabelPool: PoolProvisioned, LabelInstance: labelValue(id), LabelType: string(q.typ)}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: q.secret, Namespace: p.cfg.Namespace, Labels: labels,
			Annotations: map[string]string{
				AnnotationCert:     pki.IdentityURI(pki.Worker, cert.name).String(),
				AnnotationNotAfter: cert.notAfter.UTC().Format(time.RFC3339),
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: q.name, UID: types.UID(q.uid)}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{secretCA: p.cfg.Issuer.Trust, secretCert: cert.certPEM, secretKey: cert.keyPEM},
	}
}

// writeSecret creates q's Secret (create) or replaces it (a renewal, or a
// Secret of that name left by an earlier pod of the name whose garbage
// collection has not come yet).
func (p *Provisioner) writeSecret(ctx context.Context, id string, q *pod, cert *issued, create bool) error {
	sc := p.cfg.Client.CoreV1().Secrets(p.cfg.Namespace)
	s := p.secretFor(id, q, cert)
	if create {
		_, err := sc.Create(ctx, s, metav1.CreateOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kube: create the certificate Secret %s/%s of pod %s (instance %s): %w", p.cfg.Namespace, s.Name, q.name, id, err)
		}
	}
	// an update names the version it replaces, so that a Secret that
	// changed meanwhile (another pod of the same name took it) is not
	// overwritten; a renewal writes only its own pod's Secret, and makes
	// it again if it was deleted
	cur, err := sc.Get(ctx, s.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && !create:
		if _, err := sc.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("kube: the certificate Secret %s/%s of pod %s (instance %s) was deleted; making it again: %w", p.cfg.Namespace, s.Name, q.name, id, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("kube: read the certificate Secret %s/%s of pod %s (instance %s): %w", p.cfg.Namespace, s.Name, q.name, id, err)
	case !create && !ownedBy(cur, q.uid):
		return fmt.Errorf("kube: the certificate Secret %s/%s is not pod %s's (uid %s) any more: not renewed", p.cfg.Namespace, s.Name, q.name, q.uid)
	}
	s.ResourceVersion = cur.ResourceVersion
	if _, err := sc.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("kube: update the certificate Secret %s/%s of pod %s (instance %s): %w", p.cfg.Namespace, s.Name, q.name, id, err)
	}
	return nil
}

// ownedBy reports whether the pod of uid owns s.
func ownedBy(s *corev1.Secret, uid string) bool {
	for _, o := range s.OwnerReferences {
		if o.Kind == "Pod" && string(o.UID) == uid {
			return true
		}
	}
	return false
}

// podFor builds instance id's pod from type typ's worker Deployment.
func (p *Provisioner) podFor(ctx context.Context, id string, typ profile.WorkerTypeID) (*corev1.Pod, error) {
	sel := LabelType + "=" + string(typ)
	ds, err := p.cfg.Client.AppsV1().Deployments(p.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("kube: list the worker Deployment of type %s (label %s) in namespace %s: %w", typ, sel, p.cfg.Namespace, err)
	}
	var names []string
	for _, d := range ds.Items {
		if d.Labels[LabelType] == string(typ) { // a fake or an old server may not filter
			names = append(names, d.Name)
		}
	}
	switch len(names) {
	case 0:
		return nil, fmt.Errorf("kube: no worker Deployment for type %s in namespace %s (looked for label %s)", typ, p.cfg.Namespace, sel)
	case 1:
	default:
		slices.Sort(names)
		return nil, fmt.Errorf("kube: %d worker Deployments for type %s in namespace %s (label %s): %s; keep one", len(names), typ, p.cfg.Namespace, sel, strings.Join(names, ", "))
	}
	var tmpl corev1.PodTemplateSpec
	for _, d := range ds.Items {
		if d.Name == names[0] {
			tmpl = *d.Spec.Template.DeepCopy()
		}
	}
	labels := maps.Clone(tmpl.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelPool], labels[LabelInstance], labels[LabelType] = PoolProvisioned, labelValue(id), string(typ)
	spec := tmpl.Spec
	// A bare pod whose worker exits is done: the engine counts it lost
	// and plans a new one (a restart in place would register again
	// under an ID the engine has given up).
	spec.RestartPolicy = corev1.RestartPolicyNever
	found := false
	for i := range spec.Containers {
		c := &spec.Containers[i]
		if c.Name != WorkerContainer {
			continue
		}
		found = true
		env := slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == EnvWorkerID })
		c.Env = append([]corev1.EnvVar{{Name: EnvWorkerID, Value: id}}, env...)
	}
	if !found {
		return nil, fmt.Errorf("kube: the worker Deployment %s (type %s) has no container named %q", names[0], typ, WorkerContainer)
	}
	if p.cfg.Issuer != nil {
		// The pod's own certificate in place of the shared one.
		n := 0
		for i := range spec.Volumes {
			if s := spec.Volumes[i].Secret; s != nil && s.SecretName == WorkerTLSSecret {
				s.SecretName = SecretName(PodName(id, typ))
				s.Optional = nil // the kubelet waits for it
				n++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("kube: the worker Deployment %s (type %s) has no volume of Secret %s (the worker's --tls-dir) for the pod's own certificate to replace", names[0], typ, WorkerTLSSecret)
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: PodName(id, typ), Namespace: p.cfg.Namespace, Labels: labels, Annotations: tmpl.Annotations},
		Spec:       spec,
	}, nil
}

// Release implements coordinator.Provisioner: it deletes instance id's
// pod (one already gone is fine; an error is logged).
func (p *Provisioner) Release(id string) {
	p.mu.Lock()
	q := p.pods[id]
	delete(p.pods, id)
	p.mu.Unlock()
	if q == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.CallTimeout)
	defer cancel()
	err := p.cfg.Client.CoreV1().Pods(p.cfg.Namespace).Delete(ctx, q.name, metav1.DeleteOptions{})
	switch {
	case err == nil:
		p.cfg.Log.Info("worker pod deleted", "pod", q.name, "instance", id, "type", q.typ)
	case apierrors.IsNotFound(err):
	default:
		p.cfg.Log.Error("deleting a released worker pod failed (delete it by hand; the next coordinator deletes it at start)",
			"pod", q.name, "instance", id, "err", err)
	}
	if q.secret == "" {
		return
	}
	// The garbage collector deletes it with the pod; at once is better.
	err = p.cfg.Client.CoreV1().Secrets(p.cfg.Namespace).Delete(ctx, q.secret, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		p.cfg.Log.Warn("deleting a released worker pod's certificate Secret failed (the garbage collector deletes it with the pod; the next coordinator at start)",
			"secret", q.secret, "instance", id, "err", err)
	}
}

// renewEvery is how often the renewals are looked at: often enough that
// a certificate is renewed well before it expires.
func (p *Provisioner) renewEvery() time.Duration {
	return min(p.cfg.CertValid/10, time.Hour)
}

// renew re-issues the certificates due for renewal (two thirds of their
// validity past) and updates their Secrets; the kubelet refreshes the
// pods' files and the workers re-read them. A failure is logged and
// retried at the next look.
func (p *Provisioner) renew(ctx context.Context) {
	now := p.cfg.Clock.Now()
	type due struct {
		id string
		q  pod
	}
	var dues []due
	p.mu.Lock()
	for id, q := range p.pods {
		if q.secret != "" && !q.lost && !now.Before(q.renewAt) {
			dues = append(dues, due{id, *q})
		}
	}
	p.mu.Unlock()
	slices.SortFunc(dues, func(a, b due) int { return strings.Compare(a.id, b.id) })
	for _, d := range dues {
		cert, err := p.issue(d.id)
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, p.cfg.CallTimeout)
			err = p.writeSecret(cctx, d.id, &d.q, cert, false)
			cancel()
		}
		if err != nil {
			p.cfg.Log.Warn("renewing a worker pod's certificate failed; retrying", "instance", d.id, "secret", d.q.secret, "err", err, "in", p.renewEvery())
			continue
		}
		p.mu.Lock()
		if q := p.pods[d.id]; q != nil && q.uid == d.q.uid {
			q.renewAt = cert.renewAt
		}
		p.mu.Unlock()
		p.cfg.Log.Info("worker pod's certificate renewed", "instance", d.id, "secret", d.q.secret, "cert_expires", cert.notAfter.UTC().Format(time.RFC3339))
	}
}

// Watch starts watching the provisioned pods (restarting the watch when
// it ends) and reports the losses to lost, and with an Issuer renews the
// pods' certificates when due; Close stops both.
func (p *Provisioner) Watch(lost Losses) {
	ctx, cancel := context.WithCancel(context.Background())
	p.stop = cancel
	if p.cfg.Issuer != nil {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case <-p.cfg.Clock.After(p.renewEvery()):
					p.renew(ctx)
				}
			}
		}()
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		backoff := time.Duration(0)
		for ctx.Err() == nil {
			if backoff > 0 {
				select {
				case <-ctx.Done():
					return
				case <-p.cfg.Clock.After(backoff):
				}
			}
			if err := p.watchOnce(ctx, lost); err != nil && ctx.Err() == nil {
				p.cfg.Log.Warn("watching worker pods failed; retrying", "err", err, "in", max(backoff, time.Second))
				backoff = min(max(2*backoff, time.Second), 30*time.Second)
				continue
			}
			backoff = 0
		}
	}()
}

// Close stops the watch (the pods stay: a restarted coordinator deletes
// them at New).
func (p *Provisioner) Close() {
	if p.stop != nil {
		p.stop()
		p.wg.Wait()
	}
}

// watchOnce lists the provisioned pods (a pod of ours missing from the list
// was deleted while no watch ran), then watches from the list's version
// until the watch ends.
func (p *Provisioner) watchOnce(ctx context.Context, lost Losses) error {
	opts := metav1.ListOptions{LabelSelector: LabelPool + "=" + PoolProvisioned}
	list, err := p.cfg.Client.CoreV1().Pods(p.cfg.Namespace).List(ctx, opts)
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	seen := map[string]bool{}
	for i := range list.Items {
		seen[list.Items[i].Name] = true
		p.observe(&list.Items[i], false, lost)
	}
	p.mu.Lock()
	var gone []string
	for id, q := range p.pods {
		if !seen[q.name] && !q.lost {
			gone = append(gone, id)
		}
	}
	p.mu.Unlock()
	slices.Sort(gone)
	for _, id := range gone {
		p.report(id, "", "pod %s deleted", lost)
	}
	opts.ResourceVersion = list.ResourceVersion
	w, err := p.cfg.Client.CoreV1().Pods(p.cfg.Namespace).Watch(ctx, opts)
	if err != nil {
		return fmt.Errorf("watch pods: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil // the server ended it: list and watch again
			}
			switch ev.Type {
			case watch.Error:
				return fmt.Errorf("watch pods: %v", apierrors.FromObject(ev.Object))
			case watch.Added, watch.Modified, watch.Deleted:
				if po, ok := ev.Object.(*corev1.Pod); ok {
					p.observe(po, ev.Type == watch.Deleted, lost)
				}
			}
		}
	}
}

// observe reports a pod of ours that is gone or going.
func (p *Provisioner) observe(po *corev1.Pod, deleted bool, lost Losses) {
	if po.Labels[LabelPool] != PoolProvisioned {
		return
	}
	id := p.idOf(po)
	if id == "" {
		return
	}
	switch {
	case deleted || po.DeletionTimestamp != nil:
		p.report(id, string(po.UID), "pod %s deleted", lost)
	case po.Status.Phase == corev1.PodFailed:
		why := po.Status.Reason
		if po.Status.Message != "" {
			why = strings.TrimSpace(why + " " + po.Status.Message)
		}
		if why == "" {
			why = terminated(po)
		}
		p.report(id, string(po.UID), "pod %s failed: "+strings.ReplaceAll(why, "%", "%%"), lost)
	case po.Status.Phase == corev1.PodSucceeded:
		p.report(id, string(po.UID), "pod %s exited: its worker ended", lost)
	case ready(po):
		p.mu.Lock()
		q := p.pods[id]
		first := q != nil && !q.up
		if first {
			q.up = true
		}
		p.mu.Unlock()
		if first {
			p.cfg.Log.Info("worker pod ready", "pod", po.Name, "instance", id)
		}
	}
}

// idOf is the instance whose pod po is (by name: labels are the user's
// to copy), or "".
func (p *Provisioner) idOf(po *corev1.Pod) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, q := range p.pods {
		if q.name == po.Name {
			return id
		}
	}
	return ""
}

// report tells the engine once that instance id's pod is gone (format
// takes the pod's name); uid, when known on both sides, must match (a
// pod of an earlier instance under the same name is not this one).
func (p *Provisioner) report(id, uid, format string, lost Losses) {
	p.mu.Lock()
	q := p.pods[id]
	if q == nil || q.lost || uid != "" && q.uid != "" && uid != q.uid {
		p.mu.Unlock()
		return
	}
	q.lost = true
	name := q.name
	p.mu.Unlock()
	why := fmt.Sprintf(format, name)
	p.cfg.Log.Warn("worker pod lost", "instance", id, "why", why)
	lost.LostInstance(id, why)
}

func ready(po *corev1.Pod) bool {
	for _, c := range po.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// terminated describes the worker container's end, for a failed pod with
// no reason of its own.
func terminated(po *corev1.Pod) string {
	for _, c := range po.Status.ContainerStatuses {
		if t := c.State.Terminated; t != nil {
			return fmt.Sprintf("container %s exited %d (%s)", c.Name, t.ExitCode, t.Reason)
		}
	}
	return "phase Failed"
}

// PodName is instance id's pod name: mdag-worker-<type lowercased>-<id>,
// lowercased to DNS-1123 (any other character becomes '-'); a name over
// 63 characters is cut and ends in a hash of the whole, so it stays
// unique and a valid hostname.
func PodName(id string, typ profile.WorkerTypeID) string {
	name := dns1123(WorkerName + "-" + string(typ) + "-" + id)
	if len(name) > 63 {
		h := fnv.New32a()
		h.Write([]byte(name))
		name = strings.TrimRight(name[:54], "-") + fmt.Sprintf("-%08x", h.Sum32())
	}
	return name
}

func dns1123(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	return strings.Trim(string(b), "-")
}

// labelValue is id as a label value (at most 63 of [A-Za-z0-9-_.],
// alphanumeric at both ends).
func labelValue(id string) string {
	b := []byte(id)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '-'
		}
	}
	s := string(b)
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "-_.")
}

// pending is the instance Start returns: the engine calls neither Load
// nor Submit on a coordinator.Pending instance (its worker's connection
// replaces it when it registers), so both refuse.
type pending struct{}

func (pending) Pending() {}

func (pending) Load([]worker.ModuleSpec) error {
	return errors.New("kube: the instance's pod is not up yet (its worker has not registered)")
}

func (pending) Submit(worker.Task) {}

func (pending) Close() {}
