package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// flakySessions fails each method's first `failures` calls with UNAVAILABLE.
type flakySessions struct {
	pb.UnimplementedSessionServiceServer
	failures int
	mu       sync.Mutex
	calls    map[string]int
}

func (f *flakySessions) fail(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[name]++
	if f.calls[name] <= f.failures {
		return status.Error(codes.Unavailable, "try again")
	}
	return nil
}

func (f *flakySessions) GetSession(_ context.Context, r *pb.GetSessionRequest) (*pb.GetSessionResponse, error) {
	if err := f.fail("GetSession"); err != nil {
		return nil, err
	}
	return &pb.GetSessionResponse{Session: &pb.Session{SessionKey: r.GetSessionKey()}}, nil
}

func (f *flakySessions) ResetSession(_ context.Context, r *pb.ResetSessionRequest) (*pb.ResetSessionResponse, error) {
	if err := f.fail("ResetSession"); err != nil {
		return nil, err
	}
	return &pb.ResetSessionResponse{Session: &pb.Session{SessionKey: r.GetSessionKey()}}, nil
}

func dialFlaky(t *testing.T, failures int) (*flakySessions, *Client, context.Context) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	fake := &flakySessions{failures: failures, calls: map[string]int{}}
	pb.RegisterSessionServiceServer(srv, fake)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	c, err := Dial(ctx, "unix:"+sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return fake, c, ctx
}

// The embedded config is the repository's, and retries exactly the reads.
func TestServiceConfigIsTheRepositoryOne(t *testing.T) {
	repo, err := os.ReadFile(filepath.Join("..", "..", "service_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if string(repo) != ServiceConfig {
		t.Fatal("sidecar/service_config.json differs from clients/service_config.json: run make clients")
	}
	var cfg struct {
		MethodConfig []struct {
			Name []struct{ Service, Method string }
		}
	}
	if err := json.Unmarshal(repo, &cfg); err != nil {
		t.Fatal(err)
	}
	var methods []string
	for _, n := range cfg.MethodConfig[0].Name {
		methods = append(methods, n.Method)
	}
	slices.Sort(methods)
	want := []string{"GetQueue", "GetSession", "GetSessionContext", "GetTranscript", "ListSessions", "SearchMessages"}
	if !slices.Equal(methods, want) {
		t.Fatalf("retried methods = %v, want %v", methods, want)
	}
}

func TestReadIsRetriedOnUnavailable(t *testing.T) {
	fake, c, ctx := dialFlaky(t, 2)
	s, err := c.GetSession(ctx, "agent:main:local:dm:me")
	if err != nil {
		t.Fatal(err)
	}
	if s.GetSessionKey() != "agent:main:local:dm:me" || fake.calls["GetSession"] != 3 {
		t.Fatalf("session %q after %d calls", s.GetSessionKey(), fake.calls["GetSession"])
	}
}

func TestWriteIsNotRetried(t *testing.T) {
	fake, c, ctx := dialFlaky(t, 1)
	_, err := c.ResetSession(ctx, "agent:main:local:dm:me")
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.Unavailable {
		t.Fatalf("err = %v", err)
	}
	if fake.calls["ResetSession"] != 1 {
		t.Fatalf("ResetSession called %d times", fake.calls["ResetSession"])
	}
}

// Every reason constant of this package is declared in the proto's ErrorReason.
func TestReasonsAreDeclaredInTheProto(t *testing.T) {
	for reason := range reasonCodes {
		if _, ok := pb.ErrorReason_value["ERROR_REASON_"+strings.ToUpper(reason)]; !ok { // restart_interrupted is sent in lower case
			t.Errorf("reason %s is not declared in ErrorReason", reason)
		}
	}
}
