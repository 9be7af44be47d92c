// Command console-chat is an example adapter: a chat on stdin/stdout backed
// by agent-sidecar. Each line is a prompt for the session of
// (platform "local", chat_type "dm", chat_id = your OS user name); the reply
// streams to stdout. Commands:
//
//	/new, /reset   start a new session (ResetSession)
//	/stop          stop the running turn (SuspendSession)
//	/queue TEXT    queue TEXT as its own turn after the running one
//	/undo          back up one user turn (RewindSession n=1)
//	/help, /quit
//
// It also hosts one tool, local.clock.now, for profiles that allow "local.*".
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"os/user"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agent-sidecar/agent-sidecar/clients/go/sidecar"
)

const help = `commands: /new, /reset, /stop, /queue TEXT, /undo, /help, /quit; anything else is a prompt`

// chat is the adapter's state.
type chat struct {
	c       *sidecar.Client
	src     *sidecar.Source
	key     string
	profile string

	outMu sync.Mutex // one writer at a time on stdout
	turns sync.WaitGroup
}

func main() {
	target := flag.String("target", "unix:./data/sidecar.sock", "sidecar address: unix:/path/sidecar.sock or host:port")
	token := flag.String("token", "", "bearer token (needed over TCP when auth is on)")
	ca := flag.String("ca", "", "PEM CA file: TLS to a listener with a certificate of that CA")
	profile := flag.String("profile", "", `profile for a new session (default "main")`)
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *target, *token, *ca, *profile); err != nil {
		fmt.Fprintln(os.Stderr, "console-chat:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, target, token, ca, profile string) error {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var opts []sidecar.Option
	if token != "" {
		opts = append(opts, sidecar.WithToken(token))
	}
	if ca != "" {
		opts = append(opts, sidecar.WithCAFile(ca))
	}
	c, err := sidecar.Dial(dctx, target, opts...)
	if err != nil {
		return fmt.Errorf("%w (is the sidecar running? try 'make run')", err)
	}
	defer c.Close()

	name := "console"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	ch := &chat{c: c, profile: profile, src: &sidecar.Source{
		Platform: "local", ChatType: "dm", ChatId: name, UserId: name, UserName: name,
	}}
	sess, err := c.GetOrCreateSession(ctx, ch.src, sidecar.WithProfile(profile))
	if err != nil {
		return err
	}
	ch.key = sess.GetSessionKey()
	ch.hostTools(ctx)
	ch.say("session %s (%s). %s\n", ch.key, sess.GetSessionId(), help)

	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		if quit := ch.handle(ctx, strings.TrimSpace(lines.Text())); quit {
			break
		}
	}
	ch.turns.Wait() // let replies to piped input finish
	return lines.Err()
}

// hostTools serves local.clock.now in the background.
func (ch *chat) hostTools(ctx context.Context) {
	host := sidecar.NewToolHost("local")
	host.Register("local.clock.now", "The current local date and time (RFC 3339) and time zone.",
		`{"type":"object","properties":{}}`,
		func(context.Context, []byte) (any, error) {
			now := time.Now()
			zone, _ := now.Zone()
			return map[string]string{"now": now.Format(time.RFC3339), "zone": zone}, nil
		})
	served := make(chan error, 1)
	go func() { served <- host.Serve(ctx, ch.c) }()
	report := func(err error) {
		if err != nil {
			ch.say("[tool host stopped: %v; local.clock.now is unavailable]\n", err)
		}
	}
	select {
	case <-host.Ready(): // registered, or Serve stopped first (then Err says why)
	case <-time.After(2 * time.Second):
		ch.say("[tool host not registered yet; local.clock.now may be unavailable]\n")
	}
	if host.Err() != nil {
		report(<-served)
		return
	}
	go func() { report(<-served) }()
}

// handle runs one input line; it reports whether to quit.
func (ch *chat) handle(ctx context.Context, line string) bool {
	cmd, arg, _ := strings.Cut(line, " ")
	var err error
	switch cmd {
	case "":
	case "/quit", "/exit":
		return true
	case "/help":
		ch.say("%s\n", help)
	case "/new", "/reset":
		var s *sidecar.Session
		if s, err = ch.c.ResetSession(ctx, ch.key); err == nil {
			ch.say("[new session %s]\n", s.GetSessionId())
		}
	case "/stop":
		if _, err = ch.c.SuspendSession(ctx, ch.key); err == nil {
			ch.say("[stopped; the next message starts a new session]\n")
		}
	case "/undo":
		err = ch.undo(ctx)
	case "/queue":
		if strings.TrimSpace(arg) == "" {
			ch.say("usage: /queue TEXT\n")
			break
		}
		ch.prompt(ctx, arg, sidecar.DeliveryQueue)
	default:
		ch.prompt(ctx, line, sidecar.DeliveryDefault)
	}
	if err != nil {
		ch.say("[error: %v]\n", err)
	}
	return false
}

// undo rewinds the current incarnation by one user turn.
func (ch *chat) undo(ctx context.Context) error {
	s, err := ch.c.GetOrCreateSession(ctx, ch.src, sidecar.WithProfile(ch.profile))
	if err != nil {
		return err
	}
	res, err := ch.c.RewindSession(ctx, s.GetSessionId(), 1)
	if err != nil {
		return err
	}
	if res.GetTurnsUndone() == 0 {
		ch.say("[nothing to undo]\n")
		return nil
	}
	ch.say("[undid %d turn(s), %d message(s); you had said: %q]\n", res.GetTurnsUndone(), res.GetRewoundCount(), res.GetTargetText())
	return nil
}

// prompt streams one turn's reply in the background, so /stop and /queue
// stay usable while it runs.
func (ch *chat) prompt(ctx context.Context, text string, delivery sidecar.Delivery) {
	p := sidecar.PromptParams{Source: ch.src, Text: text, Delivery: delivery, Profile: ch.profile}
	ch.turns.Add(1)
	go func() {
		defer ch.turns.Done()
		midLine, failed := false, false
		for f, err := range ch.c.Prompt(ctx, p) {
			if err != nil {
				if !failed { // a failed frame was already shown
					ch.say("\n[%v]\n", err)
				}
				return
			}
			switch f.Kind() {
			case sidecar.KindAccepted:
				if pos := f.GetAccepted().GetQueuePosition(); pos > 0 {
					ch.say("[queued %q at position %d]\n", text, pos)
				}
			case sidecar.KindTextDelta:
				if !midLine {
					ch.say("bot> ")
					midLine = true
				}
				ch.say("%s", f.GetTextDelta().GetText())
			case sidecar.KindToolCall:
				ch.say("\n[tool %s %s]\n", f.GetToolCall().GetName(), f.GetToolCall().GetArgumentsJson())
				midLine = false
			case sidecar.KindCompleted:
				if !midLine && f.GetCompleted().GetFinalText() != "" {
					ch.say("bot> %s", f.GetCompleted().GetFinalText())
				}
				ch.say("\n")
			case sidecar.KindFailed:
				ch.say("\n[turn failed: %s %s]\n", f.GetFailed().GetReason(), f.GetFailed().GetMessage())
				midLine, failed = false, true
			case sidecar.KindSuperseded:
				ch.say("\n[superseded by a newer message]\n")
			}
		}
	}()
}

// say writes to stdout under the output lock.
func (ch *chat) say(format string, args ...any) {
	ch.outMu.Lock()
	defer ch.outMu.Unlock()
	fmt.Printf(format, args...)
}
