package kube

import (
	"context"
	"errors"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var _ Losses = (*coordinator.Engine)(nil)
var _ coordinator.Provisioner = (*Provisioner)(nil)

var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// deployment is a worker Deployment as deploy/ writes it.
func deployment(typ string) *appsv1.Deployment {
	labels := map[string]string{LabelName: WorkerName, LabelType: typ, LabelPool: "static"}
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}
	sel := map[string]string{"pool": "cpu"}
	if typ != "CPU" {
		res["nvidia.com/gpu"] = resource.MustParse("1")
		sel = map[string]string{"cloud.google.com/gke-accelerator": "nvidia-tesla-" + strings.ToLower(typ)}
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "mdag-worker-" + strings.ToLower(typ), Namespace: "mdag", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:  sel,
					RestartPolicy: corev1.RestartPolicyAlways,
					Containers: []corev1.Container{{
						Name: WorkerContainer, Image: "mdag:test",
						Args: []string{"worker", "--id=$(MDAG_WORKER_ID)", "--type=" + typ},
						Env: []corev1.EnvVar{
							{Name: EnvWorkerID, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
							{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
						},
						Resources: corev1.ResourceRequirements{Limits: res, Requests: res},
					}},
				},
			},
		},
	}
}

// fakeInst is what remote.Server hands Engine.AddInstance: it records
// loads and tasks.
type fakeInst struct {
	mu     sync.Mutex
	loads  [][]worker.ModuleSpec
	tasks  []worker.Task
	closed bool
}

func (f *fakeInst) Load(s []worker.ModuleSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loads = append(f.loads, s)
	return nil
}
func (f *fakeInst) Submit(t worker.Task) { f.mu.Lock(); f.tasks = append(f.tasks, t); f.mu.Unlock() }
func (f *fakeInst) Close()               { f.mu.Lock(); f.closed = true; f.mu.Unlock() }

// loss is one LostInstance the provisioner reported.
type loss struct{ id, why string }

type lossChan chan loss

func (c lossChan) LostInstance(id, why string) { c <- loss{id, why} }

// rig is a Stepped engine on a fake clock over the Provisioner over the
// fake clientset, the traffic app deployed.
type rig struct {
	t       *testing.T
	clk     *clock.Fake
	cs      *fake.Clientset
	p       *Provisioner
	e       *coordinator.Engine
	losses  lossChan
	watches chan struct{} // one per watch established
	frames  []coordinator.FrameResult
}

func newRig(t *testing.T, objs ...runtime.Object) *rig { return newRigLimits(t, nil, objs...) }

func newRigLimits(t *testing.T, limits map[profile.WorkerTypeID]int, objs ...runtime.Object) *rig {
	r := &rig{t: t, clk: clock.NewFake(start), losses: make(lossChan, 16), watches: make(chan struct{}, 16)}
	r.cs = fake.NewClientset(objs...)
	// Say when the pods' watch is in place (the tracker's), so a change
	// the test makes next is seen.
	r.cs.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := r.cs.Tracker().Watch(a.GetResource(), a.GetNamespace())
		r.watches <- struct{}{}
		return true, w, err
	})
	p, err := New(context.Background(), Config{Client: r.cs, Namespace: "mdag", Clock: r.clk, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	r.p = p
	e, err := coordinator.New(coordinator.Config{Clock: r.clk, Stepped: true, Provisioner: p, Method: allocator.Greedy,
		TurnOff: 30 * time.Second, StartTimeout: 2 * time.Minute, Epoch: time.Hour,
		OnFrame: func(f coordinator.FrameResult) { r.frames = append(r.frames, f) }})
	if err != nil {
		t.Fatal(err)
	}
	r.e = e
	e.Start()
	p.Watch(r.losses)
	r.waitWatch()
	t.Cleanup(func() { p.Close(); e.Close() })
	app, pf, err := examples.Parse("traffic")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Deploy(app, pf); err != nil {
		t.Fatal(err)
	}
	return r
}

// within receives from ch, or fails the test after 30 s (a generous bound
// for an event the code under test makes on its own goroutine).
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("%s within 30 s", what)
		var zero T
		return zero
	}
}

func (r *rig) waitWatch() {
	r.t.Helper()
	within(r.t, r.watches, "the provisioner's pod watch did not start")
}

// loss waits for the provisioner to report a loss and hands it to the
// engine, as the watch does in the binary.
func (r *rig) loss() loss {
	r.t.Helper()
	l := within(r.t, r.losses, "no loss reported")
	r.e.LostInstance(l.id, l.why)
	r.e.RunPending()
	return l
}

func (r *rig) pods() map[string]corev1.Pod {
	r.t.Helper()
	l, err := r.cs.CoreV1().Pods("mdag").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range l.Items {
		out[p.Labels[LabelInstance]] = p
	}
	return out
}

// advance moves the fake clock by d, running what falls due.
func (r *rig) advance(d time.Duration) {
	end := r.clk.Now().Add(d)
	for r.clk.Step(end) {
		r.e.RunPending()
	}
	r.clk.Set(end)
	r.e.RunPending()
}

// ingest sends one frame of stream s at the clock's time.
func (r *rig) ingest(s string, seq uint64) {
	r.t.Helper()
	if err := r.e.Ingest(s, seq, r.clk.Now(), media.NewFrame(32, 24), nil); err != nil {
		r.t.Fatal(err)
	}
	r.e.RunPending()
}

func threeTypes() []runtime.Object {
	return []runtime.Object{deployment("P100"), deployment("V100"), deployment("CPU")}
}

// A join makes pods of the planned types appear, built from their
// Deployments; nothing is routed to them until their workers register
// (frames meanwhile drop no-instance, saying the instances are starting);
// a registering worker gets its loads and tasks; a stream leaving unloads
// them and the pods go only after the turn-off delay.
func TestScaleUpServeScaleDown(t *testing.T) {
	r := newRig(t, threeTypes()...)
	if err := r.e.JoinAt("traffic", "cam", 5); err != nil {
		t.Fatal(err)
	}
	r.e.RunPending()
	pods := r.pods()
	if len(pods) == 0 {
		t.Fatalf("no pods after a join; replans %+v", r.e.Replans())
	}
	st := r.e.Status()
	for _, is := range st.Instances {
		po, ok := pods[is.ID]
		if !ok {
			t.Fatalf("instance %s has no pod (pods %v)", is.ID, slices.Collect(mapsKeys(pods)))
		}
		if !is.Pending || is.State != "starting" && is.State != "warm" {
			t.Errorf("instance %s before its worker registers: %+v, want pending and starting", is.ID, is)
		}
		d := deployment(is.Type)
		c := po.Spec.Containers[0]
		checks := []struct {
			what string
			ok   bool
		}{
			{"name", po.Name == PodName(is.ID, profile.WorkerTypeID(is.Type))},
			{"pool label", po.Labels[LabelPool] == PoolProvisioned},
			{"instance label", po.Labels[LabelInstance] == is.ID},
			{"type label", po.Labels[LabelType] == is.Type && po.Labels[LabelName] == WorkerName},
			{"node selector", len(po.Spec.NodeSelector) == 1 && po.Spec.NodeSelector[firstKey(d.Spec.Template.Spec.NodeSelector)] == d.Spec.Template.Spec.NodeSelector[firstKey(d.Spec.Template.Spec.NodeSelector)]},
			{"resources", c.Resources.Limits.Cpu().Equal(resource.MustParse("4")) && (is.Type == "CPU") == (c.Resources.Limits.Name("nvidia.com/gpu", resource.DecimalSI).IsZero())},
			{"env id", envValue(c, EnvWorkerID) == is.ID && envValueFrom(c, EnvWorkerID) == nil},
			{"env kept", envValueFrom(c, "POD_IP") != nil},
			{"restart", po.Spec.RestartPolicy == corev1.RestartPolicyNever},
			{"args", slices.Equal(c.Args, d.Spec.Template.Spec.Containers[0].Args)},
		}
		for _, ch := range checks {
			if !ch.ok {
				t.Errorf("pod %s of %s: %s wrong: %+v", po.Name, is.ID, ch.what, po)
			}
		}
	}
	// Before any worker registers: a frame has nowhere to go.
	r.ingest("cam", 0)
	r.advance(2 * time.Second)
	if len(r.frames) != 1 || r.frames[0].Outcome != coordinator.Dropped || r.frames[0].Reason != "no-instance" {
		t.Fatalf("a frame before the workers are up: %+v, want dropped no-instance", r.frames)
	}
	// The workers register (what remote.Server does).
	insts := map[string]*fakeInst{}
	for id, po := range pods {
		insts[id] = &fakeInst{}
		r.e.AddInstance(id, profile.WorkerTypeID(po.Labels[LabelType]), insts[id])
	}
	r.e.RunPending()
	loaded := 0
	for _, is := range r.e.Status().Instances {
		if is.Pending || is.Registered {
			t.Errorf("instance %+v after its worker registered: want bound (not pending, not self-registered)", is)
		}
		if len(is.Modules) > 0 {
			loaded++
			if len(insts[is.ID].loads) == 0 {
				t.Errorf("instance %s plans %v but its worker got no load", is.ID, is.Modules)
			}
		}
	}
	if loaded == 0 {
		t.Fatal("no instance has loads")
	}
	for i := range uint64(5) {
		r.ingest("cam", i+1)
		r.advance(50 * time.Millisecond)
	}
	tasks := 0
	for _, f := range insts {
		tasks += len(f.tasks)
	}
	if tasks == 0 {
		t.Fatal("the registered workers got no tasks")
	}
	// The workers answer what they were given (failing each task: the
	// frames drop, accounted), as it comes.
	answered := map[string]int{}
	answer := func() {
		for _, id := range slices.Sorted(mapsKeys(insts)) {
			for _, tk := range insts[id].tasks[answered[id]:] {
				r.e.Result(id, worker.Result{Task: tk.ID, Outcome: worker.ModuleError, Detail: "test worker"})
			}
			answered[id] = len(insts[id].tasks)
		}
		r.e.RunPending()
	}
	answer()
	// Scale down: the stream leaves.
	if err := r.e.Leave("cam"); err != nil {
		t.Fatal(err)
	}
	r.e.RunPending()
	for range 20 {
		r.advance(time.Second)
		answer()
	}
	if n := len(r.pods()); n != len(pods) {
		t.Fatalf("%d pods 20 s after the stream left, want all %d: the turn-off delay is 30 s", n, len(pods))
	}
	r.advance(20 * time.Second)
	if left := r.pods(); len(left) != 0 {
		t.Fatalf("pods %v left 40 s after the stream left: the turn-off delay is 30 s; instances %+v; tasks %d", slices.Collect(mapsKeys(left)), r.e.Status().Instances, len(insts["P100-0"].tasks))
	}
	for id, f := range insts {
		if !f.closed {
			t.Errorf("instance %s released but its connection not closed", id)
		}
	}
	for _, f := range r.frames {
		if f.Outcome == "" {
			t.Errorf("frame %+v has no outcome", f)
		}
	}
	if tot := r.e.Status().Sessions[0].Total; tot.Open() != 0 {
		t.Errorf("frames unaccounted: %+v", tot)
	}
}

// A pod deleted behind the coordinator's back is a lost instance: its
// frames in flight drop worker-lost, none is unaccounted, and the re-plan
// starts a replacement pod. A pod not up within the start timeout is lost
// the same way.
func TestLosses(t *testing.T) {
	cases := []struct {
		name string
		// lose makes instance id's pod go (or not come) and returns the
		// reason the loss must carry.
		lose     func(r *rig, id string, po corev1.Pod) string
		register bool
	}{
		{"pod deleted", func(r *rig, id string, po corev1.Pod) string {
			if err := r.cs.CoreV1().Pods("mdag").Delete(context.Background(), po.Name, metav1.DeleteOptions{}); err != nil {
				r.t.Fatal(err)
			}
			l := r.loss()
			if l.id != id {
				r.t.Fatalf("loss %+v, want instance %s", l, id)
			}
			return "pod " + po.Name + " deleted"
		}, true},
		{"pod evicted", func(r *rig, id string, po corev1.Pod) string {
			po.Status.Phase, po.Status.Reason, po.Status.Message = corev1.PodFailed, "Evicted", "The node was low on resource: memory."
			if _, err := r.cs.CoreV1().Pods("mdag").UpdateStatus(context.Background(), &po, metav1.UpdateOptions{}); err != nil {
				r.t.Fatal(err)
			}
			r.loss()
			return "pod " + po.Name + " failed: Evicted The node was low on resource: memory."
		}, true},
		{"registered as another type", func(r *rig, id string, po corev1.Pod) string {
			other := profile.WorkerTypeID("CPU")
			if po.Labels[LabelType] == "CPU" {
				other = "V100"
			}
			f := &fakeInst{}
			r.e.AddInstance(id, other, f)
			r.e.RunPending()
			if !f.closed || len(f.loads) > 0 {
				r.t.Fatalf("a worker of the wrong type: closed %v, loads %v; want closed, unloaded", f.closed, f.loads)
			}
			return "its worker registered as type " + string(other) + ", the plan started it as " + po.Labels[LabelType]
		}, false},
		{"start timeout", func(r *rig, id string, po corev1.Pod) string {
			r.advance(2*time.Minute + time.Second)
			return "not up within the start timeout of 2m0s"
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, threeTypes()...)
			if err := r.e.JoinAt("traffic", "cam", 5); err != nil {
				t.Fatal(err)
			}
			r.e.RunPending()
			pods := r.pods()
			insts := map[string]*fakeInst{}
			if c.register {
				for id, po := range pods {
					insts[id] = &fakeInst{}
					r.e.AddInstance(id, profile.WorkerTypeID(po.Labels[LabelType]), insts[id])
				}
				r.e.RunPending()
			}
			// The victim: an instance with work in flight, or any one.
			for i := range uint64(3) {
				r.ingest("cam", i)
			}
			victim := ""
			for _, id := range slices.Sorted(mapsKeys(pods)) {
				if f := insts[id]; victim == "" || f != nil && len(f.tasks) > 0 && len(insts[victim].tasks) == 0 {
					victim = id
				}
			}
			plansBefore := len(r.e.Replans())
			why := c.lose(r, victim, pods[victim])
			rps := r.e.Replans()
			if !slices.ContainsFunc(rps[plansBefore:], func(rp coordinator.Replan) bool { return strings.Contains(rp.Trigger, victim+" lost: "+why) }) {
				t.Fatalf("no re-plan for the loss of %s (%q): %+v", victim, why, rps[plansBefore:])
			}
			if c.register && len(insts[victim].tasks) > 0 {
				lost := 0
				for _, f := range r.frames {
					if f.Reason == "worker-lost" {
						lost++
					}
				}
				if lost == 0 {
					t.Errorf("instance %s had tasks in flight, no frame dropped worker-lost: %+v", victim, r.frames)
				}
			}
			// The replacement: a pod of the victim's type, new or under
			// the same ID, not the old one.
			typ := pods[victim].Labels[LabelType]
			now := r.pods()
			n := 0
			for _, po := range now {
				if po.Labels[LabelType] == typ {
					n++
				}
			}
			if n == 0 {
				t.Fatalf("no %s pod after the re-plan (pods %v; problems %v)", typ, slices.Collect(mapsKeys(now)), rps[len(rps)-1].Problems)
			}
			// The replacement has an ID of its own: a late report about
			// the victim (its gRPC stream ending after the engine
			// closed it) reaches nothing.
			if _, reused := now[victim]; reused {
				t.Fatalf("the replacement of %s took its ID (pods %v)", victim, slices.Collect(mapsKeys(now)))
			}
			r.e.LostInstance(victim, "released by the coordinator")
			r.e.RunPending()
			if after := r.pods(); len(after) != len(now) {
				t.Fatalf("a stale loss report about %s changed the pods: %v, then %v", victim, slices.Collect(mapsKeys(now)), slices.Collect(mapsKeys(after)))
			}
			// Nor does its worker registering again (its pod not gone
			// yet): it is closed, not made an instance.
			late := &fakeInst{}
			r.e.AddInstance(victim, profile.WorkerTypeID(typ), late)
			r.e.RunPending()
			if !late.closed || len(late.loads) > 0 {
				t.Fatalf("a late registration under %s: closed %v, loads %v; want closed", victim, late.closed, late.loads)
			}
			for _, is := range r.e.Status().Instances {
				if is.ID == victim {
					t.Fatalf("a late registration under %s made it an instance again: %+v", victim, is)
				}
			}
			if err := r.e.Leave("cam"); err != nil {
				t.Fatal(err)
			}
			r.advance(10 * time.Second) // past LostAfter: every frame ends
			if tot := r.e.Status().Sessions[0].Total; tot.Open() != 0 {
				t.Errorf("frames unaccounted: %+v", tot)
			}
		})
	}
}

// Start's errors name what is wrong and where, and reach the plan's
// problems.
func TestStartErrors(t *testing.T) {
	noWorker := deployment("CPU")
	noWorker.Spec.Template.Spec.Containers[0].Name = "main"
	twin := deployment("CPU")
	twin.Name = "mdag-worker-cpu-2"
	cases := []struct {
		name string
		objs []runtime.Object
		want string
	}{
		{"no deployment", []runtime.Object{deployment("P100")}, "no worker Deployment for type CPU in namespace mdag (looked for label mdag.io/worker-type=CPU)"},
		{"two deployments", []runtime.Object{deployment("CPU"), twin}, "2 worker Deployments for type CPU"},
		{"no worker container", []runtime.Object{noWorker}, `has no container named "worker"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cs := fake.NewClientset(c.objs...)
			p, err := New(context.Background(), Config{Client: cs, Limits: map[profile.WorkerTypeID]int{"CPU": 2}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Start("CPU-0", "CPU"); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Start: %v, want %q", err, c.want)
			}
		})
	}
	// And in a plan.
	r := newRigLimits(t, map[profile.WorkerTypeID]int{"P100": 2, "CPU": 2}, deployment("CPU"))
	if err := r.e.JoinAt("traffic", "cam", 5); err != nil {
		t.Fatal(err)
	}
	r.e.RunPending()
	rps := r.e.Replans()
	if len(rps) == 0 || !hasDetail(toSet(rps[0].Problems), "start P100-0: kube: no worker Deployment for type P100 in namespace mdag") {
		t.Fatalf("replans %+v: want Start's error among the problems", rps)
	}
}

// New deletes the provisioned pods a previous coordinator left and
// leaves the others; the default limits are DefaultLimit per type with a
// worker Deployment.
func TestNewCleansUpAndLimits(t *testing.T) {
	left := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "mdag-worker-cpu-cpu-3", Namespace: "mdag",
		Labels: map[string]string{LabelPool: PoolProvisioned, LabelInstance: "CPU-3", LabelType: "CPU"}}}
	static := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "mdag-worker-cpu-abc", Namespace: "mdag",
		Labels: map[string]string{LabelPool: "static", LabelType: "CPU"}}}
	cs := fake.NewClientset(left, static, deployment("CPU"), deployment("P100"))
	p, err := New(context.Background(), Config{Client: cs})
	if err != nil {
		t.Fatal(err)
	}
	l, err := cs.CoreV1().Pods("mdag").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 1 || l.Items[0].Name != static.Name {
		t.Fatalf("pods after New: %+v, want only the static one", l.Items)
	}
	want := map[profile.WorkerTypeID]int{"CPU": DefaultLimit, "P100": DefaultLimit}
	if got := p.Limits(); len(got) != len(want) || got["CPU"] != want["CPU"] || got["P100"] != want["P100"] {
		t.Fatalf("limits %v, want %v", got, want)
	}
	// A pod under the name of the next one (not ours) makes Start's
	// error say so.
	if _, err := cs.CoreV1().Pods("mdag").Create(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: PodName("CPU-9", "CPU"), Namespace: "mdag"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Start("CPU-9", "CPU"); err == nil || !strings.Contains(err.Error(), "a pod of that name exists") {
		t.Fatalf("Start over an existing pod: %v", err)
	}
	// The limit holds.
	p2, err := New(context.Background(), Config{Client: cs, Limits: map[profile.WorkerTypeID]int{"CPU": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Start("CPU-0", "CPU"); err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Start("CPU-1", "CPU"); err == nil || !strings.Contains(err.Error(), "CPU limit of 1 pods reached") {
		t.Fatalf("second Start over a limit of 1: %v", err)
	}
	p2.Release("CPU-0")
	if _, err := p2.Start("CPU-1", "CPU"); err != nil {
		t.Fatalf("Start after a Release: %v", err)
	}
}

func TestPodName(t *testing.T) {
	long := strings.Repeat("x", 80)
	cases := []struct{ id, typ, want string }{
		{"P100-0", "P100", "mdag-worker-p100-p100-0"},
		{"cpu_1.a", "CPU", "mdag-worker-cpu-cpu-1-a"},
		{"Weird ID!", "gpu/a", "mdag-worker-gpu-a-weird-id"},
	}
	for _, c := range cases {
		if got := PodName(c.id, profile.WorkerTypeID(c.typ)); got != c.want {
			t.Errorf("PodName(%q, %q) = %q, want %q", c.id, c.typ, got, c.want)
		}
	}
	a, b := PodName(long+"a", "CPU"), PodName(long+"b", "CPU")
	if len(a) > 63 || a == b {
		t.Errorf("long IDs: %q, %q: want distinct names of at most 63", a, b)
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func firstKey(m map[string]string) string {
	for k := range m {
		return k
	}
	return ""
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func envValueFrom(c corev1.Container, name string) *corev1.EnvVarSource {
	for _, e := range c.Env {
		if e.Name == name {
			return e.ValueFrom
		}
	}
	return nil
}

func hasDetail(m map[string]uint64, s string) bool {
	for k := range m {
		if strings.Contains(k, s) {
			return true
		}
	}
	return false
}

func toSet(xs []string) map[string]uint64 {
	out := map[string]uint64{}
	for _, x := range xs {
		out[x]++
	}
	return out
}

// The watch restarts when the server ends it, and a pod deleted while no
// watch ran is found by the list that starts the next one; a pod that
// becomes ready is no loss, one that exits is.
func TestWatchRestarts(t *testing.T) {
	cs := fake.NewClientset(deployment("CPU"))
	first := watch.NewFake()
	watches := make(chan struct{}, 4)
	n := 0
	cs.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		n++
		defer func() { watches <- struct{}{} }()
		if n == 1 {
			return true, first, nil
		}
		w, err := cs.Tracker().Watch(a.GetResource(), a.GetNamespace())
		return true, w, err
	})
	p, err := New(context.Background(), Config{Client: cs, Limits: map[profile.WorkerTypeID]int{"CPU": 3}})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"CPU-0", "CPU-1", "CPU-2"} {
		if _, err := p.Start(id, "CPU"); err != nil {
			t.Fatal(err)
		}
	}
	losses := make(lossChan, 4)
	p.Watch(losses)
	defer p.Close()
	wait := func(what string) {
		t.Helper()
		within(t, watches, what+": no watch")
	}
	next := func() loss {
		t.Helper()
		return within(t, losses, "no loss reported")
	}
	wait("first")
	// CPU-0 becomes ready (on the manual watch): no loss.
	po, err := cs.CoreV1().Pods("mdag").Get(context.Background(), PodName("CPU-0", "CPU"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	po.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	first.Modify(po)
	// CPU-1 goes while the watch misses it; the server ends the watch.
	if err := cs.CoreV1().Pods("mdag").Delete(context.Background(), PodName("CPU-1", "CPU"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	first.Stop()
	wait("restart")
	if l := next(); l != (loss{"CPU-1", "pod mdag-worker-cpu-cpu-1 deleted"}) {
		t.Fatalf("loss %+v, want CPU-1's pod deleted", l)
	}
	// CPU-2's worker exits (on the new watch).
	po, err = cs.CoreV1().Pods("mdag").Get(context.Background(), PodName("CPU-2", "CPU"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	po.Status.Phase = corev1.PodFailed
	po.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error"}}}}
	if _, err := cs.CoreV1().Pods("mdag").UpdateStatus(context.Background(), po, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if l := next(); l != (loss{"CPU-2", "pod mdag-worker-cpu-cpu-2 failed: container worker exited 2 (Error)"}) {
		t.Fatalf("loss %+v, want CPU-2's pod failed", l)
	}
	// Released pods are deleted and their deletion is no loss.
	p.Release("CPU-0")
	p.Release("CPU-2")
	if _, err := cs.CoreV1().Pods("mdag").Get(context.Background(), PodName("CPU-0", "CPU"), metav1.GetOptions{}); err == nil {
		t.Fatal("CPU-0's pod still there after Release")
	}
	select {
	case l := <-losses:
		t.Fatalf("loss %+v after a Release", l)
	default:
	}
}

// A watch that cannot start (the API server refuses the list) is retried
// after a backoff on the injected clock, and then reports what it missed.
func TestWatchRetriesAfterError(t *testing.T) {
	cs := fake.NewClientset(deployment("CPU"))
	clk := clock.NewFake(start)
	p, err := New(context.Background(), Config{Client: cs, Clock: clk, Limits: map[profile.WorkerTypeID]int{"CPU": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Start("CPU-0", "CPU"); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Pods("mdag").Delete(context.Background(), PodName("CPU-0", "CPU"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	lists := make(chan int, 8)
	n := 0
	cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		n++
		lists <- n
		if n == 1 {
			return true, nil, errors.New("the server is unavailable")
		}
		return false, nil, nil
	})
	losses := make(lossChan, 4)
	p.Watch(losses)
	defer p.Close()
	deadline := time.After(30 * time.Second)
	if got := <-lists; got != 1 {
		t.Fatalf("list %d first", got)
	}
	// The retry waits on the fake clock: move it on until the second
	// list comes (the goroutine arms its timer at its own pace).
	for again := false; !again; {
		select {
		case <-lists:
			again = true
		case <-deadline:
			t.Fatal("no second list within 30 s")
		default:
			if clk.Pending() > 0 {
				clk.Advance(time.Second)
			}
			goruntime.Gosched()
		}
	}
	select {
	case l := <-losses:
		if l != (loss{"CPU-0", "pod mdag-worker-cpu-cpu-0 deleted"}) {
			t.Fatalf("loss %+v", l)
		}
	case <-deadline:
		t.Fatal("the pod deleted while the watch failed was not reported")
	}
}

// TestNewOutOfRange: a negative timeout or validity is an error naming
// the field, not a value silently replaced.
func TestNewOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{CallTimeout: -time.Second}, "kube.Config.CallTimeout = -1s"},
		{Config{CertValid: -time.Hour}, "kube.Config.CertValid = -1h0m0s"},
	} {
		tc.cfg.Client = fake.NewClientset()
		if _, err := New(context.Background(), tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want an error with %q", err, tc.want)
		}
	}
}
