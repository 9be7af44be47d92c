// Run by clients/packaging/check.sh from an outside module that requires
// github.com/agent-sidecar/agent-sidecar/clients/go (with a replace to a clean
// copy): one real call to a live sidecar.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/agent-sidecar/agent-sidecar/clients/go/sidecar"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := sidecar.Dial(ctx, os.Args[1])
	if err != nil {
		fail(err)
	}
	defer c.Close()
	source := &sidecar.Source{Platform: "package-check", ChatId: "go"}
	s, err := c.GetOrCreateSession(ctx, source)
	if err != nil {
		fail(err)
	}
	frames, err := sidecar.Collect(c.Prompt(ctx, sidecar.PromptParams{Source: source, Text: "hello from the module"}))
	if err != nil {
		fail(err)
	}
	final := frames[len(frames)-1].GetCompleted().GetFinalText()
	if final != "hello from the module" {
		fail(fmt.Errorf("final text %q", final))
	}
	fmt.Printf("package-check: go client: %s answered %q\n", s.GetSessionKey(), final)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "package-check:", err)
	os.Exit(1)
}
