package coordinator

import (
	"time"

	"github.com/mdag/mdag/coordinator/why"
)

// Observer receives the coordinator's events and state. observe/metrics
// implements it for Prometheus (through Observe); the default records
// nothing. Calls come from the coordinator's loop: they must not block.
type Observer interface {
	// App and Module return the recorders of one app and one module;
	// called once each when an app is deployed.
	App(app string) AppObserver
	Module(app, module, model string, gpu bool) ModuleObserver
	StateObserver
}

// StateObserver receives the coordinator's state and planning events.
type StateObserver interface {
	// Session sets an app's state: live streams, the last complete
	// window's finish rate (haveRate false: no window yet) and its cost.
	Session(app string, streams int, finishRate float64, haveRate bool, costAllocated, costWhole float64)
	// ModuleFactors sets a module's current scaling and ballooning factors.
	ModuleFactors(app, module string, scale, balloon float64)
	// Instances sets the instance count per (worker type, state).
	Instances(counts map[[2]string]int)
	// Cost sets the cluster's cost per hour: whole instances and the
	// allocated share.
	Cost(whole, allocated float64)
	// Solve records a planner stage's time ("allocate", "place").
	Solve(stage string, d time.Duration)
	// Trigger counts a re-plan trigger by kind; Replanned a re-plan.
	Trigger(kind why.Trigger)
	Replanned()
}

// AppObserver records one app's frames.
type AppObserver interface {
	FrameSent()
	Admitted(share float64)
	Refused()
	IngestDelay(d time.Duration)
	Frame(outcome, module string, reason why.Drop, latency time.Duration)
}

// ModuleObserver records one module's items and batches.
type ModuleObserver interface {
	In()
	Exec(d time.Duration)
	Queued(d time.Duration)
	Batch(size int)
	SchedulerDrop(reason why.Drop)
	Rejected()
	// StateEvent counts a stateful module's state event: migrate, restore,
	// reset or failed (affinity.go); MigrationPause records how long a
	// stream's frames waited for its state to move.
	StateEvent(kind string)
	MigrationPause(d time.Duration)
}

// Recorder is an observer whose per-app and per-module recorders are
// concrete types (observe/metrics.*Metrics): Observe adapts it.
type Recorder[A AppObserver, M ModuleObserver] interface {
	App(app string) A
	Module(app, module, model string, gpu bool) M
	StateObserver
}

// Observe adapts r to an Observer, so that the package implementing it
// need not import the coordinator.
func Observe[A AppObserver, M ModuleObserver](r Recorder[A, M]) Observer { return adapted[A, M]{r} }

type adapted[A AppObserver, M ModuleObserver] struct{ Recorder[A, M] }

func (a adapted[A, M]) App(app string) AppObserver { return a.Recorder.App(app) }
func (a adapted[A, M]) Module(app, module, model string, gpu bool) ModuleObserver {
	return a.Recorder.Module(app, module, model, gpu)
}

// nop is the default Observer: it records nothing.
type nop struct{}

func (nop) App(string) AppObserver                               { return nop{} }
func (nop) Module(string, string, string, bool) ModuleObserver   { return nop{} }
func (nop) Session(string, int, float64, bool, float64, float64) {}
func (nop) ModuleFactors(string, string, float64, float64)       {}
func (nop) Instances(map[[2]string]int)                          {}
func (nop) Cost(float64, float64)                                {}
func (nop) Solve(string, time.Duration)                          {}
func (nop) Trigger(why.Trigger)                                  {}
func (nop) Replanned()                                           {}
func (nop) FrameSent()                                           {}
func (nop) Admitted(float64)                                     {}
func (nop) Refused()                                             {}
func (nop) IngestDelay(time.Duration)                            {}
func (nop) Frame(string, string, why.Drop, time.Duration)        {}
func (nop) In()                                                  {}
func (nop) Exec(time.Duration)                                   {}
func (nop) Queued(time.Duration)                                 {}
func (nop) Batch(int)                                            {}
func (nop) SchedulerDrop(why.Drop)                               {}
func (nop) Rejected()                                            {}
func (nop) StateEvent(string)                                    {}
func (nop) MigrationPause(time.Duration)                         {}
