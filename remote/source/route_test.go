package source

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// A connection to an ingest worker is shared by the streams open there and
// closed with the last of them; the next stream routed there dials again,
// and close ends every connection and all dialling.
func TestRouterConnsFollowTheirStreams(t *testing.T) {
	dials := 0
	r := &router{dial: func(addr string) (*grpc.ClientConn, error) {
		dials++
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}}
	a, err := r.conn("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.conn("127.0.0.1:1")
	if err != nil || b != a || dials != 1 {
		t.Fatalf("second stream to the same worker: %v, same conn %v, %d dials", err, b == a, dials)
	}
	other, err := r.conn("127.0.0.1:2")
	if err != nil || dials != 2 {
		t.Fatalf("another worker: %v, %d dials", err, dials)
	}
	r.release("127.0.0.1:1")
	if a.GetState() == connectivity.Shutdown {
		t.Fatal("closed while a stream still uses it")
	}
	r.release("127.0.0.1:1")
	if a.GetState() != connectivity.Shutdown || len(r.conns) != 1 {
		t.Fatalf("after its last stream: state %v, %d conns kept", a.GetState(), len(r.conns))
	}
	if c, err := r.conn("127.0.0.1:1"); err != nil || c == a || dials != 3 {
		t.Fatalf("routed there again: %v, new conn %v, %d dials", err, c != a, dials)
	}
	r.close()
	if other.GetState() != connectivity.Shutdown || len(r.conns) != 0 {
		t.Fatalf("close left %d conns (the other worker's: %v)", len(r.conns), other.GetState())
	}
	if _, err := r.conn("127.0.0.1:3"); err == nil {
		t.Fatal("dialled after close")
	}
	r.release("127.0.0.1:1") // a stream ending after close: nothing to do
}
