package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/profile"
)

// tlsDeployment is a worker Deployment as deploy/ writes it, with its
// worker TLS volume: Secret mdag-worker-tls mounted at --tls-dir.
func tlsDeployment(typ string) *appsv1.Deployment {
	d := deployment(typ)
	ps := &d.Spec.Template.Spec
	ps.Containers[0].Args = append(ps.Containers[0].Args, "--tls-dir=/etc/mdag/tls")
	ps.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "tls", MountPath: "/etc/mdag/tls", ReadOnly: true}}
	mode := int32(0o440)
	ps.Volumes = []corev1.Volume{
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: WorkerTLSSecret, DefaultMode: &mode}}},
	}
	return d
}

// testIssuer is a CA as mdag certs init makes it, created at the fake
// clock's start.
func testIssuer(t *testing.T) *Issuer {
	t.Helper()
	ca, err := pki.NewCA("test CA", start, pki.DefaultCAValid)
	if err != nil {
		t.Fatal(err)
	}
	return &Issuer{CA: ca, Trust: pki.CertPEM(ca.Cert)}
}

// uids gives each pod the fake creates a UID, as the API server does.
func uids(cs *fake.Clientset) {
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		po := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		po.UID = types.UID("uid-" + po.Name)
		return false, nil, nil
	})
}

// logBuffer is a logger writing into a buffer the test reads.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

func getPod(t *testing.T, cs *fake.Clientset, name string) *corev1.Pod {
	t.Helper()
	po, err := cs.CoreV1().Pods("mdag").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return po
}

func getSecret(t *testing.T, cs *fake.Clientset, name string) *corev1.Secret {
	t.Helper()
	s, err := cs.CoreV1().Secrets("mdag").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func secretNames(t *testing.T, cs *fake.Clientset) []string {
	t.Helper()
	l, err := cs.CoreV1().Secrets("mdag").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range l.Items {
		out = append(out, s.Name)
	}
	return out
}

// checkCert checks a per-pod Secret's certificate: it parses, pairs with
// its key, chains to the issuer's CA as a client at now, and is
// mdag://worker/name. It returns the certificate.
func checkCert(t *testing.T, s *corev1.Secret, iss *Issuer, name string, now time.Time) *x509.Certificate {
	t.Helper()
	for _, k := range []string{"ca.pem", "worker.pem", "worker-key.pem"} {
		if len(s.Data[k]) == 0 {
			t.Fatalf("Secret %s has no %s (keys of --tls-dir for role worker: ca.pem, worker.pem, worker-key.pem)", s.Name, k)
		}
	}
	if !bytes.Equal(s.Data["ca.pem"], iss.Trust) {
		t.Errorf("Secret %s: ca.pem is not the issuer's trust", s.Name)
	}
	if _, err := tls.X509KeyPair(s.Data["worker.pem"], s.Data["worker-key.pem"]); err != nil {
		t.Errorf("Secret %s: worker.pem and worker-key.pem: %v", s.Name, err)
	}
	b, _ := pem.Decode(s.Data["worker.pem"])
	if b == nil {
		t.Fatalf("Secret %s: worker.pem is no PEM", s.Name)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(iss.CA.Cert)
	if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("Secret %s: worker.pem does not chain to the issuer's CA as a client: %v", s.Name, err)
	}
	role, got, err := pki.RoleOf(c)
	if err != nil || role != pki.Worker || got != name {
		t.Errorf("Secret %s: certificate mdag://%s/%s (%v), want mdag://worker/%s", s.Name, role, got, err, name)
	}
	return c
}

// With an issuer, Start gives the pod a certificate of its own, named its
// MDAG_WORKER_ID, in a Secret the pod owns and mounts in place of the
// shared one; Release deletes both.
func TestStartIssuesCertificate(t *testing.T) {
	clk := clock.NewFake(start)
	cs := fake.NewClientset(tlsDeployment("CPU"), tlsDeployment("P100"))
	uids(cs)
	iss := testIssuer(t)
	var logs logBuffer
	p, err := New(context.Background(), Config{Client: cs, Clock: clk, Issuer: iss, Log: logs.logger(), Limits: map[profile.WorkerTypeID]int{"CPU": 2, "P100": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "SHARE ONE CERTIFICATE") {
		t.Errorf("New with an issuer warns of a shared certificate: %s", logs.String())
	}
	for _, c := range []struct{ id, typ string }{{"CPU-0", "CPU"}, {"P100-3", "P100"}} {
		if _, err := p.Start(c.id, profile.WorkerTypeID(c.typ)); err != nil {
			t.Fatal(err)
		}
		po := getPod(t, cs, PodName(c.id, profile.WorkerTypeID(c.typ)))
		id := envValue(po.Spec.Containers[0], EnvWorkerID)
		if id != c.id {
			t.Fatalf("pod %s: %s %q, want %q", po.Name, EnvWorkerID, id, c.id)
		}
		want := SecretName(po.Name)
		var tlsVol *corev1.Volume
		for i, v := range po.Spec.Volumes {
			if v.Secret != nil && v.Secret.SecretName == WorkerTLSSecret {
				t.Errorf("pod %s still mounts the shared %s (volume %s)", po.Name, WorkerTLSSecret, v.Name)
			}
			if v.Name == "tls" {
				tlsVol = &po.Spec.Volumes[i]
			}
		}
		if tlsVol == nil || tlsVol.Secret == nil || tlsVol.Secret.SecretName != want || tlsVol.Secret.DefaultMode == nil || *tlsVol.Secret.DefaultMode != 0o440 {
			t.Fatalf("pod %s: volume tls %+v, want Secret %s (mode kept)", po.Name, tlsVol, want)
		}
		s := getSecret(t, cs, want)
		cert := checkCert(t, s, iss, id, start)
		if got, want := cert.NotAfter, start.Add(DefaultCertValid); !got.Equal(want) {
			t.Errorf("Secret %s: certificate valid until %v, want %v (%v from the clock's now)", s.Name, got, want, DefaultCertValid)
		}
		if s.Type != corev1.SecretTypeOpaque {
			t.Errorf("Secret %s: type %s, want Opaque", s.Name, s.Type)
		}
		if len(s.OwnerReferences) != 1 {
			t.Fatalf("Secret %s: owners %+v, want its pod", s.Name, s.OwnerReferences)
		}
		o := s.OwnerReferences[0]
		if o.APIVersion != "v1" || o.Kind != "Pod" || o.Name != po.Name || o.UID != po.UID || po.UID == "" {
			t.Errorf("Secret %s: owner %+v, want Pod %s uid %s", s.Name, o, po.Name, po.UID)
		}
		if s.Labels[LabelPool] != PoolProvisioned || s.Labels[LabelInstance] != c.id || s.Annotations[AnnotationCert] != "mdag://worker/"+c.id {
			t.Errorf("Secret %s: labels %v annotations %v", s.Name, s.Labels, s.Annotations)
		}
	}
	p.Release("CPU-0")
	if _, err := cs.CoreV1().Pods("mdag").Get(context.Background(), PodName("CPU-0", "CPU"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod of CPU-0 after Release: %v, want not found", err)
	}
	if got := secretNames(t, cs); len(got) != 1 || got[0] != SecretName(PodName("P100-3", "P100")) {
		t.Errorf("Secrets after releasing CPU-0: %v, want only P100-3's", got)
	}
	// A Secret already gone (the garbage collector was first) is fine.
	if err := cs.CoreV1().Secrets("mdag").Delete(context.Background(), SecretName(PodName("P100-3", "P100")), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	p.Release("P100-3")
	if strings.Contains(logs.String(), "failed") {
		t.Errorf("Release logged a failure: %s", logs.String())
	}
}

// A certificate two thirds through its validity is renewed in its Secret,
// by the loop Watch starts, on the injected clock.
func TestCertificateRenewal(t *testing.T) {
	clk := clock.NewFake(start)
	afters := make(chan time.Duration, 16)
	cs := fake.NewClientset(tlsDeployment("CPU"))
	uids(cs)
	updates := make(chan struct{}, 16)
	cs.PrependReactor("update", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		updates <- struct{}{}
		return false, nil, nil
	})
	iss := testIssuer(t)
	valid := 30 * time.Hour
	p, err := New(context.Background(), Config{Client: cs, Clock: notifyClock{clk, afters}, Issuer: iss, CertValid: valid, Limits: map[profile.WorkerTypeID]int{"CPU": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Start("CPU-0", "CPU"); err != nil {
		t.Fatal(err)
	}
	name := SecretName(PodName("CPU-0", "CPU"))
	first := checkCert(t, getSecret(t, cs, name), iss, "CPU-0", start)
	p.Watch(make(lossChan, 16))
	defer p.Close()
	// The pod watch's retry timers (After(backoff), 1 s to 30 s) come on
	// the same channel: the renewal loop's is the hour.
	renewal := func(what string) time.Duration {
		for {
			if d := within(t, afters, what); d >= time.Hour || d == p.renewEvery() {
				return d
			}
		}
	}
	if d := renewal("the renewal loop set no timer"); d != p.renewEvery() || d != time.Hour {
		t.Fatalf("renewal timer %v, want %v (a tenth of the validity, at most an hour)", d, time.Hour)
	}
	// Not due yet: looked at, left.
	p.renew(context.Background())
	if c := checkCert(t, getSecret(t, cs, name), iss, "CPU-0", start); !c.Equal(first) {
		t.Fatal("a certificate renewed before it was due")
	}
	due := start.Add(20 * time.Hour)
	clk.Set(due)
	within(t, updates, "no Secret update after the renewal time passed")
	renewal("the renewal loop did not go on") // the update is done, renewAt moved
	s := getSecret(t, cs, name)
	c := checkCert(t, s, iss, "CPU-0", due)
	if c.Equal(first) || !c.NotAfter.Equal(due.Add(valid)) {
		t.Fatalf("renewed certificate valid until %v, want a new one until %v", c.NotAfter, due.Add(valid))
	}
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != getPod(t, cs, PodName("CPU-0", "CPU")).UID {
		t.Errorf("renewed Secret's owners %+v, want the pod", s.OwnerReferences)
	}
	// Next due two thirds through the new one.
	p.renew(context.Background())
	if got := checkCert(t, getSecret(t, cs, name), iss, "CPU-0", due); !got.Equal(c) {
		t.Fatal("renewed again at once")
	}
}

// notifyClock is a fake clock that says each After it is asked for.
type notifyClock struct {
	*clock.Fake
	afters chan time.Duration
}

func (c notifyClock) After(d time.Duration) <-chan time.Time {
	ch := c.Fake.After(d)
	c.afters <- d
	return ch
}

// New deletes the per-pod Secrets a previous coordinator left (label
// mdag.io/pool=provisioned), and no other.
func TestNewCleansLeftoverSecrets(t *testing.T) {
	left := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: SecretName(PodName("CPU-3", "CPU")), Namespace: "mdag",
		Labels: map[string]string{LabelPool: PoolProvisioned, LabelInstance: "CPU-3"}}}
	shared := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: WorkerTLSSecret, Namespace: "mdag"}}
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "mdag", Labels: map[string]string{LabelPool: "static"}}}
	for _, withIssuer := range []bool{true, false} {
		cs := fake.NewClientset(left, shared, other, tlsDeployment("CPU"))
		cfg := Config{Client: cs, Clock: clock.NewFake(start)}
		if withIssuer {
			cfg.Issuer = testIssuer(t)
		}
		if _, err := New(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(secretNames(t, cs), " "); got != "mdag-worker-tls x" {
			t.Errorf("issuer %v: Secrets after New: %s, want mdag-worker-tls x", withIssuer, got)
		}
	}
	// Not allowed to list Secrets: fine without an issuer (a Role of
	// before per-pod certificates), an error with one.
	for _, withIssuer := range []bool{false, true} {
		cs := fake.NewClientset(tlsDeployment("CPU"))
		cs.PrependReactor("list", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(corev1.Resource("secrets"), "", errors.New("RBAC"))
		})
		cfg := Config{Client: cs, Clock: clock.NewFake(start)}
		if withIssuer {
			cfg.Issuer = testIssuer(t)
		}
		_, err := New(context.Background(), cfg)
		if withIssuer != (err != nil) || err != nil && !strings.Contains(err.Error(), "list leftover per-pod certificate Secrets") {
			t.Errorf("issuer %v, Secrets forbidden: New: %v", withIssuer, err)
		}
	}
}

// Without an issuer the pods share the template's certificate, as before,
// and New says so once, loudly.
func TestNoIssuerSharesCertificate(t *testing.T) {
	cs := fake.NewClientset(tlsDeployment("CPU"))
	var logs logBuffer
	p, err := New(context.Background(), Config{Client: cs, Clock: clock.NewFake(start), Log: logs.logger(), Limits: map[profile.WorkerTypeID]int{"CPU": 2}})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"CPU-0", "CPU-1"} {
		if _, err := p.Start(id, "CPU"); err != nil {
			t.Fatal(err)
		}
		po := getPod(t, cs, PodName(id, "CPU"))
		if v := po.Spec.Volumes[1]; v.Secret == nil || v.Secret.SecretName != WorkerTLSSecret {
			t.Errorf("pod %s: volume %+v, want the shared %s", po.Name, v, WorkerTLSSecret)
		}
	}
	if got := secretNames(t, cs); len(got) != 0 {
		t.Errorf("Secrets %v without an issuer, want none", got)
	}
	if n := strings.Count(logs.String(), "level=WARN msg=\"PROVISIONED WORKERS SHARE ONE CERTIFICATE"); n != 1 {
		t.Errorf("%d warnings of the shared certificate, want 1:\n%s", n, logs.String())
	}
	p.Release("CPU-0")
	p.Release("CPU-1")
	if strings.Contains(logs.String(), "level=ERROR") || strings.Contains(logs.String(), "Secret") && strings.Contains(logs.String(), "failed") {
		t.Errorf("Release without an issuer logged a failure: %s", logs.String())
	}
}

// Start's errors with an issuer: an ID that is no certificate name, a
// template without the shared certificate's volume (nothing made), and a
// Secret the API refuses (the pod deleted again).
func TestIssuerStartErrors(t *testing.T) {
	long := strings.Repeat("T", 70)
	cs := fake.NewClientset(tlsDeployment("CPU"), deployment("P100"), tlsDeployment(long))
	uids(cs)
	p, err := New(context.Background(), Config{Client: cs, Clock: clock.NewFake(start), Issuer: testIssuer(t),
		Limits: map[profile.WorkerTypeID]int{"CPU": 2, "P100": 2, profile.WorkerTypeID(long): 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Start(long+"-0", profile.WorkerTypeID(long)); err == nil || !strings.Contains(err.Error(), "not a certificate name") {
		t.Errorf("Start of a 72-character ID: %v, want not a certificate name", err)
	}
	if _, err := p.Start("P100-0", "P100"); err == nil || !strings.Contains(err.Error(), "has no volume of Secret mdag-worker-tls") {
		t.Errorf("Start from a template without the TLS volume: %v", err)
	}
	cs.PrependReactor("create", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("secrets"), "", errors.New("RBAC"))
	})
	if _, err := p.Start("CPU-0", "CPU"); err == nil || !strings.Contains(err.Error(), "create the certificate Secret") {
		t.Errorf("Start with Secrets refused: %v", err)
	}
	l, err := cs.CoreV1().Pods("mdag").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 0 {
		t.Errorf("pods after the failed Starts: %d, want none", len(l.Items))
	}
	// The failed Start counts no pod against the limit.
	cs.ReactionChain = cs.ReactionChain[1:]
	for _, id := range []string{"CPU-1", "CPU-2"} {
		if _, err := p.Start(id, "CPU"); err != nil {
			t.Fatalf("Start %s after the failures: %v", id, err)
		}
	}
}

// A Secret of the pod's name an earlier pod left (its garbage collection
// not done yet) is replaced, owned by the new pod.
func TestStartReplacesStaleSecret(t *testing.T) {
	cs := fake.NewClientset(tlsDeployment("CPU"))
	uids(cs)
	iss := testIssuer(t)
	p, err := New(context.Background(), Config{Client: cs, Clock: clock.NewFake(start), Issuer: iss, Limits: map[profile.WorkerTypeID]int{"CPU": 1}})
	if err != nil {
		t.Fatal(err)
	}
	stale := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: SecretName(PodName("CPU-0", "CPU")), Namespace: "mdag",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: PodName("CPU-0", "CPU"), UID: "old"}}},
		Data: map[string][]byte{"worker.pem": []byte("old")}}
	if _, err := cs.CoreV1().Secrets("mdag").Create(context.Background(), stale, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Start("CPU-0", "CPU"); err != nil {
		t.Fatal(err)
	}
	s := getSecret(t, cs, stale.Name)
	checkCert(t, s, iss, "CPU-0", start)
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != types.UID("uid-"+PodName("CPU-0", "CPU")) {
		t.Errorf("owners %+v, want the new pod", s.OwnerReferences)
	}
}

// TestRenewalWritesOnlyItsPodsSecret (review): a renewal makes a deleted
// Secret again, and leaves alone a Secret of the same name that another
// pod owns now (a new pod of the same name took it): before, the update
// was unconditional, overwrote the new pod's Secret with the old pod as
// its owner, and the garbage collector then deleted it.
func TestRenewalWritesOnlyItsPodsSecret(t *testing.T) {
	clk := clock.NewFake(start)
	cs := fake.NewClientset(tlsDeployment("CPU"))
	uids(cs)
	iss := testIssuer(t)
	valid := 30 * time.Hour
	p, err := New(context.Background(), Config{Client: cs, Clock: clk, Issuer: iss, CertValid: valid, Limits: map[profile.WorkerTypeID]int{"CPU": 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Start("CPU-0", "CPU"); err != nil {
		t.Fatal(err)
	}
	name := SecretName(PodName("CPU-0", "CPU"))
	ctx := context.Background()
	sc := cs.CoreV1().Secrets("mdag")

	// deleted by hand: made again at the renewal
	if err := sc.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	due := start.Add(20 * time.Hour)
	clk.Set(due)
	p.renew(ctx)
	checkCert(t, getSecret(t, cs, name), iss, "CPU-0", due)

	// another pod's now: not touched
	s := getSecret(t, cs, name)
	s.OwnerReferences[0].UID = "another-pod"
	s.Data["marker"] = []byte("theirs")
	if _, err := sc.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	clk.Set(due.Add(20 * time.Hour))
	p.renew(ctx)
	if got := getSecret(t, cs, name); string(got.Data["marker"]) != "theirs" || got.OwnerReferences[0].UID != "another-pod" {
		t.Fatalf("a renewal overwrote another pod's Secret: owners %+v", got.OwnerReferences)
	}
}
