package coordinator

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
)

type fakeExec struct{}

func (fakeExec) Run(context.Context, string, []*media.Item) ([][]*media.Item, error) { return nil, nil }
func (fakeExec) Kind() string                                                        { return "fake" }

// Config.Executor gives in-process workers their executor instead of an
// emulated one; its error fails the instance's start, naming it.
func TestLocalExecutorFactory(t *testing.T) {
	limit := map[profile.WorkerTypeID]int{"G": 2}
	var asked []string
	_, l, err := NewEmbedded(Config{MILPSolver: milp.Solver{}, Executor: func(id string, typ profile.WorkerTypeID) (gpu.Executor, error) {
		asked = append(asked, id+"/"+string(typ))
		if id == "bad" {
			return nil, errors.New("no library")
		}
		return fakeExec{}, nil
	}}, limit)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Start("g-0", "G"); err != nil {
		t.Fatal(err)
	}
	if l.Emulated("g-0") != nil {
		t.Error("an instance with a handed-in executor has an emulated one too")
	}
	if _, err := l.Start("bad", "G"); err == nil || !strings.Contains(err.Error(), "instance bad: executor: no library") {
		t.Fatalf("start with a failing factory: %v", err)
	}
	if strings.Join(asked, ",") != "g-0/G,bad/G" {
		t.Fatalf("factory asked for %v", asked)
	}
	// the failed start left nothing behind: the type's limit still has room
	if _, err := l.Start("g-1", "G"); err != nil {
		t.Fatal(err)
	}
}
