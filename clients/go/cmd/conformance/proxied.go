package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/agent-sidecar/agent-sidecar/clients/go/sidecar"
	"google.golang.org/grpc/codes"
)

// proxyCmd sends one command to the harness's cuttable proxy
// (clients/conformance/README.md) and returns how many connections it accepted.
func (r *runner) proxyCmd(command string) (int, error) {
	conn, err := net.DialTimeout("tcp", r.proxyControl, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "%s\n", command); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return 0, err
	}
	var n int
	if _, err := fmt.Sscanf(line, "ok %d", &n); err != nil {
		return 0, fmt.Errorf("proxy %s: %q", command, line)
	}
	return n, nil
}

// cutTurn runs the scenario's prompt through c and calls action (in the
// background) after cut_after_frames frames; the turn must complete gapless.
func cutTurn(ctx context.Context, c *sidecar.Client, sc *scenario, action func() error) error {
	p, err := promptParams(sc, sc.Text)
	if err != nil {
		return err
	}
	cutAfter := max(sc.CutAfterFrames, 1)
	acted := make(chan error, 1)
	var frames []*sidecar.Frame
	for f, err := range c.Prompt(ctx, p) {
		if err != nil {
			return fmt.Errorf("after %v: %w", kindsOf(frames), err)
		}
		frames = append(frames, f)
		if len(frames) == cutAfter {
			go func() { acted <- action() }()
		}
	}
	if len(frames) <= cutAfter {
		return fmt.Errorf("turn ended after %d frames, before the cut could matter", len(frames))
	}
	if err := <-acted; err != nil {
		return err
	}
	if err := checkGapless(frames); err != nil {
		return err
	}
	if want := sc.Expect.LastKind; want != "" && lastKind(frames) != want {
		return fmt.Errorf("last kind %q, want %q", lastKind(frames), want)
	}
	if want := sc.Expect.FinalText; want != nil && finalText(frames) != *want {
		return fmt.Errorf("final_text %q, want %q", finalText(frames), *want)
	}
	return nil
}

func (r *runner) viaProxy(ctx context.Context, opts ...sidecar.Option) (*sidecar.Client, error) {
	if _, err := r.proxyCmd("up"); err != nil {
		return nil, err
	}
	return dial(ctx, r.proxy, opts...)
}

func streamResume(ctx context.Context, r *runner, sc *scenario) error {
	c, err := r.viaProxy(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	before, _ := r.proxyCmd("count")
	err = cutTurn(ctx, c, sc, func() error { _, err := r.proxyCmd("cut"); return err })
	if after, _ := r.proxyCmd("count"); err == nil && after <= before {
		return errors.New("the client never reconnected after the cut")
	}
	return err
}

func streamStall(ctx context.Context, r *runner, sc *scenario) error {
	c, err := r.viaProxy(ctx, sidecar.WithStreamIdleTimeout(time.Duration(sc.IdleTimeoutMS)*time.Millisecond))
	if err != nil {
		return err
	}
	defer c.Close()
	return cutTurn(ctx, c, sc, func() error { _, err := r.proxyCmd("stall"); return err })
}

func promptOutage(ctx context.Context, r *runner, sc *scenario) error {
	c, err := r.viaProxy(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return cutTurn(ctx, c, sc, func() error {
		if _, err := r.proxyCmd("down"); err != nil {
			return err
		}
		time.Sleep(time.Duration(sc.OutageMS) * time.Millisecond)
		_, err := r.proxyCmd("up")
		return err
	})
}

func watchAfterTerminal(ctx context.Context, r *runner, sc *scenario) error {
	c, err := r.unixClient(ctx)
	if err != nil {
		return err
	}
	p, err := promptParams(sc, sc.Text)
	if err != nil {
		return err
	}
	frames, err := sidecar.Collect(c.Prompt(ctx, p))
	if err != nil {
		return err
	}
	last := frames[len(frames)-1].Seq
	for _, w := range []struct {
		after int64
		want  []string
	}{{last, sc.Expect.AtTerminalKinds}, {last - 1, sc.Expect.BeforeTerminalKinds}} {
		wctx, cancel := context.WithTimeout(ctx, time.Duration(sc.WithinMS)*time.Millisecond)
		got, err := sidecar.Collect(c.Watch(wctx, sidecar.WatchParams{RequestID: p.RequestID, AfterSeq: w.after}))
		cancel()
		if err != nil {
			return fmt.Errorf("watch after_seq=%d: %w", w.after, err)
		}
		if k := kindsOf(got); !slices.Equal(k, w.want) && !(len(k) == 0 && len(w.want) == 0) {
			return fmt.Errorf("watch after_seq=%d: kinds %v, want %v", w.after, k, w.want)
		}
	}
	return nil
}

func toolHostOutage(ctx context.Context, r *runner, sc *scenario) error {
	if _, err := r.proxyCmd("down"); err != nil {
		return err
	}
	defer r.proxyCmd("up")
	c, err := sidecar.Dial(ctx, r.proxy, sidecar.WithLazyConnect(),
		sidecar.WithResumeWindow(time.Duration(sc.ResumeWindowMS)*time.Millisecond))
	if err != nil {
		return err
	}
	defer c.Close()
	host := sidecar.NewToolHost(sc.Tool.Namespace)
	host.Register(sc.Tool.Name, sc.Tool.Description, sc.Tool.Schema, func(_ context.Context, args []byte) (any, error) {
		var in struct{ A, B int64 }
		if err := json.Unmarshal(args, &in); err != nil {
			return nil, err
		}
		return in.A + in.B, nil
	})
	hctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- host.Serve(hctx, c) }()
	defer func() { stop(); <-served }()
	time.Sleep(time.Duration(sc.FirstOutageMS) * time.Millisecond)
	r.proxyCmd("up")
	select {
	case <-host.Ready():
		if err := host.Err(); err != nil {
			return fmt.Errorf("tool host: %v", err)
		}
	case <-ctx.Done():
		return fmt.Errorf("tool host never registered: %w", ctx.Err())
	}
	r.proxyCmd("down")
	time.Sleep(time.Duration(sc.OutageMS) * time.Millisecond)
	select {
	case err := <-served:
		return fmt.Errorf("the tool host stopped during the outage: %v", err)
	default:
	}
	r.proxyCmd("up")
	uc, err := r.unixClient(ctx)
	if err != nil {
		return err
	}
	// Until the host has registered again, the turn cannot call the tool.
	for {
		p, err := promptParams(sc, sc.Text)
		if err != nil {
			return err
		}
		frames, err := sidecar.Collect(uc.Prompt(ctx, p))
		if err == nil && strings.Contains(finalText(frames), sc.Expect.FinalTextContains) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no tool call served after the outage: %v (kinds %v)", err, kindsOf(frames))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func clientDeadline(ctx context.Context, r *runner, sc *scenario) error {
	c, err := r.viaProxy(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := r.proxyCmd("stall"); err != nil {
		return err
	}
	src, err := sc.source()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, time.Duration(sc.CallTimeoutMS)*time.Millisecond)
	defer cancel()
	_, err = c.GetOrCreateSession(cctx, src)
	e, ok := sidecar.FromError(err)
	if !ok {
		return fmt.Errorf("want a DEADLINE_EXCEEDED *Error, got %v", err)
	}
	if e.Code != codes.DeadlineExceeded || e.Reason != *sc.Expect.Reason || errors.Is(err, sidecar.ErrAgentTimeout) {
		return fmt.Errorf("got code %v reason %q", e.Code, e.Reason)
	}
	return nil
}

func targetForms(ctx context.Context, r *runner, sc *scenario) error {
	path := unixPath(r.unixTarget)
	src, err := sc.source()
	if err != nil {
		return err
	}
	ids := map[string]bool{}
	for _, form := range sc.Forms {
		target := strings.NewReplacer("{path}", path, "{tcp}", r.tcpTarget).Replace(form)
		var opts []sidecar.Option
		if strings.Contains(form, "{tcp}") {
			opts = append(opts, sidecar.WithToken(r.token))
		}
		c, err := dial(ctx, target, opts...)
		if err != nil {
			return fmt.Errorf("%s: %w", target, err)
		}
		s, err := c.GetOrCreateSession(ctx, src)
		c.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", target, err)
		}
		ids[s.GetSessionId()] = true
	}
	if len(ids) != 1 {
		return fmt.Errorf("session ids %v", ids)
	}
	for _, target := range sc.Invalid {
		if _, err := sidecar.Dial(ctx, target, sidecar.WithLazyConnect()); !errors.Is(err, sidecar.ErrInvalidTarget) {
			return fmt.Errorf("target %q was not refused: %v", target, err)
		}
	}
	for _, target := range sc.Accepted { // forms no sidecar here listens on: taken, not dialled
		c, err := sidecar.Dial(ctx, target, sidecar.WithLazyConnect())
		if err != nil {
			return fmt.Errorf("target %q was refused: %v", target, err)
		}
		c.Close()
	}
	return nil
}
