// Package why is the coordinator's vocabulary of reasons: why a frame was
// dropped (Drop) and what kind of event asked for a re-plan (Trigger).
// Every value is a named constant, listed by Drops and Triggers, and
// classified by methods (Drop.Load, Drop.Capacity) rather than by string
// comparisons spread over the callers, in the manner of Nomad's named
// filter reasons and LiveKit's close reasons.
//
// The values are the strings the metrics' label values, the status JSON,
// the logs and the dashboard carry, so an alert or a query written against
// one keeps its meaning. The central scheduler's reasons
// (scheduler.DropReason) and a worker's outcomes (worker.Outcome) are
// among them under their own strings (the coordinator's tests hold both
// lists inside this one), so that this package stays a leaf the metrics and the
// dashboard import without the engine.
package why

// Drop says why a frame was dropped: at the module it names, or before
// any ("-": shed at ingest, lost, cut off by a restart).
type Drop string

// Scheduler: the central scheduler's reasons (scheduler.DropReason).
const (
	CannotFinish   Drop = "cannot-finish"    // it could not finish by its deadline (the scheduler's verdict, or the coordinator's estimate before routing)
	ActionRejected Drop = "action-rejected"  // its GPU batch could not start in its action window
	NoGPUForModel  Drop = "no-gpu-for-model" // no GPU has the model loaded
	EarlyDrop      Drop = "early-drop"       // Nexus's sliding window dropped it to save a batch
)

// Worker: a worker's outcomes other than ok (worker.Outcome's String).
const (
	Rejected        Drop = "rejected"          // never ends a frame: a GPU batch whose window passed is re-scheduled (mdag_scheduler_rejected_total); listed as the worker's outcome
	QueueFull       Drop = "queue-full"        // the module's queue on the worker was full
	ModuleNotLoaded Drop = "module-not-loaded" // the worker has not loaded the module
	Unloaded        Drop = "unloaded"          // the module was unloaded before the task ran
	ModuleError     Drop = "module-error"      // a CPU op failed on the item
	ExecutorError   Drop = "executor"          // the GPU executor failed on the batch
	BadResult       Drop = "bad-result"        // the worker's result could not be used
	BadTask         Drop = "bad-task"          // the worker could not decode the task
	PeerLost        Drop = "peer-lost"         // an input could not be fetched from the worker holding it
)

// Coordinator: the coordinator's own.
const (
	NoPlan             Drop = "no-plan"             // the session has no feasible plan yet
	NoInstance         Drop = "no-instance"         // no live instance hosts the module (or the stateful module's stream)
	WorkerLost         Drop = "worker-lost"         // the instance running it was lost
	Shed               Drop = "shed"                // the plan carries only part of the rate: shed at ingest
	Lost               Drop = "lost"                // still open long past its deadline
	CoordinatorRestart Drop = "coordinator-restart" // in flight when the coordinator stopped, counted at restore
)

var drops = []Drop{
	CannotFinish, ActionRejected, NoGPUForModel, EarlyDrop,
	Rejected, QueueFull, ModuleNotLoaded, Unloaded, ModuleError, ExecutorError, BadResult, BadTask, PeerLost,
	NoPlan, NoInstance, WorkerLost, Shed, Lost, CoordinatorRestart,
}

// Drops lists every drop reason, in the order of the declarations.
func Drops() []Drop { return append([]Drop(nil), drops...) }

// Known says whether d is one of Drops.
func (d Drop) Known() bool {
	for _, k := range drops {
		if d == k {
			return true
		}
	}
	return false
}

// Load says whether a slow or busy machine causes d: a frame that can no
// longer finish by its deadline, a batch that could not start in its
// window, a full queue. Any other reason means a frame had no route, was
// shed by policy or met a failure, which load alone never explains where
// a plan exists.
func (d Drop) Load() bool {
	switch d {
	case CannotFinish, ActionRejected, EarlyDrop, QueueFull:
		return true
	}
	return false
}

// Capacity says whether more capacity fixes d: the load drops, and a
// module or model that no running instance hosts. The finish-rate
// re-plan counts only these.
func (d Drop) Capacity() bool {
	return d.Load() || d == NoInstance || d == NoGPUForModel
}

// Trigger is the kind of event that asked for a re-plan (Replan.Kinds, the
// mdag_planner_triggers_total label).
type Trigger string

// The trigger kinds.
const (
	OnDeploy           Trigger = "deploy"            // an app deployed with streams kept warm
	OnJoin             Trigger = "join"              // a stream joined
	OnLeave            Trigger = "leave"             // a stream left (or the last frames of a session's streams ended)
	OnFrameSize        Trigger = "frame"             // the streams' frame size changed from what the plan assumed
	OnScaling          Trigger = "scaling"           // a module's observed scaling factor moved
	OnBallooning       Trigger = "ballooning"        // a module runs slower than its profile (execution time inflated)
	OnFinishRate       Trigger = "finish-rate"       // windows below the finish target for reasons capacity fixes
	OnEpoch            Trigger = "epoch"             // the periodic re-plan
	OnWorkerRegistered Trigger = "worker-registered" // a worker registered
	OnWorkerLost       Trigger = "worker-lost"       // a worker was lost
	OnDrain            Trigger = "drain"             // an operator drains a worker
	OnIngest           Trigger = "ingest"            // the ingest delay moved away from what the plan reserved
	OnTurnOff          Trigger = "turn-off"          // warm instances reached the turn-off delay
)

var triggers = []Trigger{
	OnDeploy, OnJoin, OnLeave, OnFrameSize, OnScaling, OnBallooning, OnFinishRate, OnEpoch,
	OnWorkerRegistered, OnWorkerLost, OnDrain, OnIngest, OnTurnOff,
}

// Triggers lists every trigger kind, in the order of the declarations.
func Triggers() []Trigger { return append([]Trigger(nil), triggers...) }

// Known says whether t is one of Triggers.
func (t Trigger) Known() bool {
	for _, k := range triggers {
		if t == k {
			return true
		}
	}
	return false
}

// Routine says whether a re-plan of this kind alone is expected to change
// nothing most of the time (the periodic epoch, the turn-off timer): such
// rounds are recorded only when they change something.
func (t Trigger) Routine() bool { return t == OnEpoch || t == OnTurnOff }
