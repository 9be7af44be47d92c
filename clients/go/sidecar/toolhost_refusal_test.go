package sidecar

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/agent-sidecar/agent-sidecar/clients/go/agentsidecarv1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// refusingTools registers every stream and invokes t.answer on it; the first
// stream's result is refused as the sidecar refuses one past its limits
// (INVALID_ARGUMENT naming result.result_json, the stream ended), later
// results are handed to results.
type refusingTools struct {
	pb.UnimplementedToolServiceServer
	streams atomic.Int32
	results chan *pb.ToolInvocationResult
}

func (f *refusingTools) ServeTools(s grpc.BidiStreamingServer[pb.ServeToolsRequest, pb.ServeToolsResponse]) error {
	n := f.streams.Add(1)
	req, err := s.Recv()
	if err != nil {
		return err
	}
	reg := req.GetRegister()
	if err := s.Send(&pb.ServeToolsResponse{Message: &pb.ServeToolsResponse_Registered{
		Registered: &pb.ToolsRegistered{Namespace: reg.GetNamespace(), ToolNames: []string{"t.answer"}}}}); err != nil {
		return err
	}
	if err := s.Send(&pb.ServeToolsResponse{Message: &pb.ServeToolsResponse_Invocation{
		Invocation: &pb.ToolInvocation{InvocationId: "i" + string(rune('0'+n)), ToolName: "t.answer", ArgumentsJson: "{}"}}}); err != nil {
		return err
	}
	req, err = s.Recv()
	if err != nil {
		return err
	}
	if n == 1 {
		st, _ := status.New(codes.InvalidArgument, "result.result_json: larger than 1000 bytes").WithDetails(
			&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: ReasonInvalidArgument})
		return st.Err()
	}
	f.results <- req.GetResult()
	<-s.Context().Done()
	return nil
}

// A result the sidecar refuses (one past its limits) fails that call and ends
// the stream; the host registered fine, so it registers again and answers the
// next call. Serve returned the refusal before, leaving every later call of
// the host's tools without a host ("no tool host serves").
func TestToolHostSurvivesARefusedResult(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	ft := &refusingTools{results: make(chan *pb.ToolInvocationResult, 1)}
	pb.RegisterToolServiceServer(srv, ft)
	go srv.Serve(l)
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, "unix:"+sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	host := NewToolHost("t")
	host.OnRetry = func(int, error) {}
	host.Register("answer", "", nil, func(context.Context, []byte) (any, error) {
		return strings.Repeat("x", 10), nil
	})
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- host.Serve(sctx, c) }()
	select {
	case r := <-ft.results:
		if r.GetInvocationId() != "i2" || !r.GetOk() {
			t.Fatalf("second stream's result = %v", r)
		}
	case err := <-served:
		t.Fatalf("Serve returned after a refused result: %v", err)
	case <-ctx.Done():
		t.Fatal("no second registration")
	}
	stop()
	if err := <-served; err != nil {
		t.Fatalf("Serve = %v", err)
	}
}
