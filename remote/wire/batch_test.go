package wire

import (
	"testing"

	"github.com/mdag/mdag/api"
)

func task(id uint64) *api.CoordinatorMessage {
	return &api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Task{Task: &api.Task{Id: id}}}
}

func notRegistered(m *api.CoordinatorMessage) bool { return m.GetRegistered() == nil }

// TestGather: a batch is the first message and what is queued behind it,
// in order, without waiting; it stops before a message it may not carry
// (handed back as next), at MaxBatch messages and before MaxBatchBytes.
func TestGather(t *testing.T) {
	reg := &api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Registered{Registered: &api.Registered{}}}
	big := &api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Task{Task: &api.Task{Id: 99, State: make([]byte, MaxBatchBytes-8)}}}
	for _, c := range []struct {
		name     string
		queued   []*api.CoordinatorMessage
		wantLen  int
		wantNext *api.CoordinatorMessage
	}{
		{"nothing queued", nil, 1, nil},
		{"all queued", []*api.CoordinatorMessage{task(2), task(3)}, 3, nil},
		{"stops at one it may not carry", []*api.CoordinatorMessage{task(2), reg, task(4)}, 2, reg},
		{"stops before the bytes", []*api.CoordinatorMessage{task(2), big, task(4)}, 2, big},
	} {
		ch := make(chan *api.CoordinatorMessage, 8)
		for _, m := range c.queued {
			ch <- m
		}
		batch, next, has := Gather(task(1), ch, notRegistered)
		if len(batch) != c.wantLen || next != c.wantNext || has != (c.wantNext != nil) {
			t.Errorf("%s: %d messages, next task %d (%v); want %d, task %d", c.name, len(batch), next.GetTask().GetId(), has, c.wantLen, c.wantNext.GetTask().GetId())
		}
		for i, m := range batch {
			if m.GetTask().GetId() != uint64(i+1) {
				t.Errorf("%s: message %d is task %d: out of order", c.name, i, m.GetTask().GetId())
			}
		}
	}
	ch := make(chan *api.CoordinatorMessage, MaxBatch+10)
	for i := range MaxBatch + 10 {
		ch <- task(uint64(i + 2))
	}
	if batch, _, has := Gather(task(1), ch, notRegistered); len(batch) != MaxBatch || has || len(ch) != 11 {
		t.Errorf("a long queue: a batch of %d (next %v), %d left; want %d and 11 left", len(batch), has, len(ch), MaxBatch)
	}
}

// TestPack: one message alone goes as it is; several as one batch, in
// order, up to the message that may not be batched, handed back as next;
// a message that may not be batched is never wrapped.
func TestPack(t *testing.T) {
	ch := make(chan *api.CoordinatorMessage, 4)
	if m, next := PackDown(task(1), ch); m.GetTask().GetId() != 1 || next != nil {
		t.Errorf("alone: %v, next %v", m, next)
	}
	reg := &api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Registered{Registered: &api.Registered{}}}
	ch <- task(2)
	ch <- reg
	m, next := PackDown(task(1), ch)
	if b := m.GetBatch(); b == nil || len(b.Msgs) != 2 || b.Msgs[0].GetTask().GetId() != 1 || b.Msgs[1].GetTask().GetId() != 2 || next != reg {
		t.Errorf("a batch of tasks 1 and 2, then the registered: %v, next %v", m, next)
	}
	ch <- task(2)
	if m, next := PackDown(reg, ch); m != reg || next != nil || len(ch) != 1 {
		t.Errorf("a registered is never batched: %v, next %v, %d queued", m, next, len(ch))
	}
	up := make(chan *api.WorkerMessage, 2)
	up <- &api.WorkerMessage{Msg: &api.WorkerMessage_Heartbeat{Heartbeat: &api.Heartbeat{}}}
	if m, _ := PackUp(&api.WorkerMessage{Msg: &api.WorkerMessage_Heartbeat{Heartbeat: &api.Heartbeat{}}}, up); len(m.GetBatch().GetMsgs()) != 2 {
		t.Errorf("two heartbeats up: %v", m)
	}
}
