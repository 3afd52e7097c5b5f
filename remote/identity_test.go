package remote

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/internal/pki"
)

// issue signs a certificate of role named name with the CA in dir into
// its own directory and loads it.
func issue(t *testing.T, dir string, role pki.Role, name string) *pki.Material {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	if _, err := pki.IssueFiles(dir, pki.IssueOptions{Role: role, Name: name, Out: out}); err != nil {
		t.Fatal(err)
	}
	return material(t, pki.DirFiles(out, role), role)
}

// TestIdentityBound (issue 36, findings 4 and 11): under mutual TLS a
// worker registers only as its certificate's name and a source joins only
// streams of its certificate's name, or, for a certificate declared shared
// (Server.Shared, --shared-cert), only IDs and streams of its prefixes. A
// refusal is PermissionDenied naming the claim and the certificate, counted
// `identity`, and nothing registers or joins. Before, any worker's
// certificate registered any ID (taking a restarted coordinator's
// awaiting workers' IDs) and any source's joined any stream.
func TestIdentityBound(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	c := startTLSWith(t, dir, func(s *Server) {
		s.Shared = []SharedCert{
			{Role: pki.Worker, Name: "fleet", Prefixes: []string{"k8s-", "P100-"}},
			{Role: pki.Source, Name: "lobby", Prefixes: []string{"lobby-"}},
		}
	})
	gpu1 := issue(t, dir, pki.Worker, "gpu-1")
	fleet := issue(t, dir, pki.Worker, "fleet")
	deflt := material(t, pki.DirFiles(dir, pki.Worker), pki.Worker) // mdag certs init's mdag://worker/worker
	door := issue(t, dir, pki.Source, "door-cam")
	lobby := issue(t, dir, pki.Source, "lobby")

	register := func(m *pki.Material, id string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		st, err := api.NewCoordinatorClient(dialTLS(t, c.addr, m)).Connect(ctx)
		if err != nil {
			return err
		}
		if err := st.Send(&api.WorkerMessage{Msg: &api.WorkerMessage_Register{Register: &api.Register{Id: id, Type: "CPU"}}}); err != nil {
			return err
		}
		if _, err := st.Recv(); err != nil {
			return err
		}
		if !c.registered(id) {
			t.Errorf("%s was told it registered but is not a worker", id)
		}
		return st.CloseSend()
	}
	join := func(m *pki.Material, stream string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		st, err := api.NewCoordinatorClient(dialTLS(t, c.addr, m)).Ingest(ctx)
		if err != nil {
			return err
		}
		if err := st.Send(&api.IngestMessage{Join: &api.Join{App: "traffic", Stream: stream}}); err != nil {
			return err
		}
		_, err = st.CloseAndRecv()
		return err
	}
	const denied = "is not the certificate's"
	tests := []struct {
		name string
		err  func() error
		want string // "" admitted, else in the PermissionDenied error
	}{
		{"a worker as its own name", func() error { return register(gpu1, "gpu-1") }, ""},
		{"a worker as another's ID", func() error { return register(gpu1, "gpu-2") }, `register: worker ID "gpu-2" is not the certificate's: mdag://worker/gpu-1`},
		{"the default certificate as its name", func() error { return register(deflt, "worker") }, ""},
		{"the default certificate as an awaited worker", func() error { return register(deflt, "V100-0") }, `worker ID "V100-0" ` + denied + `: mdag://worker/worker`},
		{"a shared certificate within its prefixes", func() error { return register(fleet, "k8s-a") }, ""},
		{"a shared certificate within its other prefix", func() error { return register(fleet, "P100-3") }, ""},
		{"a shared certificate outside its prefixes", func() error { return register(fleet, "gpu-1x") },
			`worker ID "gpu-1x" ` + denied + `: mdag://worker/fleet is shared (--shared-cert worker/fleet=k8s-,P100-) and may claim only those starting with k8s- or P100-`},
		{"a source's own stream", func() error { return join(door, "door-cam") }, ""},
		{"a source's stream below its name", func() error { return join(door, "door-cam/2") }, ""},
		{"a source's name as a prefix of another", func() error { return join(door, "door-cam2") }, `ingest: stream "door-cam2" ` + denied + `: mdag://source/door-cam`},
		{"a source taking another camera's stream", func() error { return join(door, "lobby-1") }, `stream "lobby-1" ` + denied},
		{"a shared source within its prefix", func() error { return join(lobby, "lobby-1") }, ""},
		{"a shared source outside its prefix", func() error { return join(lobby, "door-cam") }, `stream "door-cam" ` + denied + `: mdag://source/lobby is shared`},
	}
	refused := 0
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			refused++
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want PermissionDenied containing %q", err, tc.want)
			}
		})
	}
	for _, id := range []string{"gpu-2", "V100-0", "gpu-1x"} {
		if c.registered(id) {
			t.Errorf("%s registered", id)
		}
	}
	if n := c.srv.Refused()[RefusedIdentity]; n != uint64(refused) {
		t.Errorf("%s refusals %d, want %d", RefusedIdentity, n, refused)
	}
	waitFor(t, "the shared certificate's registration logged as shared", 10*time.Second, func() bool {
		return strings.Contains(c.log.String(), "instance=k8s-a") && strings.Contains(c.log.String(), "cert_shared=")
	})
	for _, line := range strings.Split(c.log.String(), "\n") {
		if strings.Contains(line, "instance=gpu-1 ") && strings.Contains(line, "cert_shared") {
			t.Errorf("a worker's own certificate logged as shared: %s", line)
		}
	}
}

// TestParseSharedCert: --shared-cert's syntax.
func TestParseSharedCert(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want SharedCert
		err  string
	}{
		{"worker/k8s=mdag-worker-,P100-", SharedCert{Role: pki.Worker, Name: "k8s", Prefixes: []string{"mdag-worker-", "P100-"}}, ""},
		{"source/lobby=*", SharedCert{Role: pki.Source, Name: "lobby", Prefixes: []string{"*"}}, ""},
		{"worker/k8s", SharedCert{}, "want ROLE/NAME=PREFIX"},
		{"worker/k8s=", SharedCert{}, "want ROLE/NAME=PREFIX"},
		{"k8s=x", SharedCert{}, "want ROLE/NAME=PREFIX"},
		{"coordinator/c=x", SharedCert{}, "want worker or source"},
		{"worker/bad name=x", SharedCert{}, "character ' '"},
		{"worker/k8s=a,,b", SharedCert{}, `prefix ""`},
		{"worker/k8s=a b", SharedCert{}, `prefix "a b"`},
	} {
		got, err := ParseSharedCert(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error containing %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%q (-want +got):\n%s", tc.in, d)
		}
		if got.String() != tc.in {
			t.Errorf("%q: String() %q", tc.in, got.String())
		}
	}
}
