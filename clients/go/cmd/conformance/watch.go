package main

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/agent-sidecar/agent-sidecar/clients/go/sidecar"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// watchOpens counts the WatchActivity calls a client opens (its first and
// every resume): the library keeps no count of its own.
func watchOpens(n *atomic.Int32) grpc.DialOption {
	return grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
		method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if strings.HasSuffix(method, "/WatchActivity") {
			n.Add(1)
		}
		return streamer(ctx, desc, cc, method, opts...)
	})
}

// watchTooSlow: a platform watch left unread while turns stream is cut
// STREAM_TOO_SLOW by the sidecar and resumes from its cursor by itself.
func watchTooSlow(ctx context.Context, r *runner, sc *scenario) error {
	producer, err := r.unixClient(ctx)
	if err != nil {
		return err
	}
	src, err := sc.source()
	if err != nil {
		return err
	}
	first, err := sidecar.Collect(producer.Prompt(ctx, sidecar.PromptParams{Source: src, Text: "before", Profile: sc.Profile}))
	if err != nil {
		return fmt.Errorf("first turn: %w", err)
	}
	// Its own connection, with a 64 KB HTTP/2 window (no BDP growth) that flow control fills.
	var opens atomic.Int32
	watcher, err := dial(ctx, r.unixTarget, sidecar.WithDialOptions(grpc.WithInitialWindowSize(65535),
		grpc.WithInitialConnWindowSize(65535), watchOpens(&opens)))
	if err != nil {
		return err
	}
	defer watcher.Close()
	next, stop := iter.Pull2(watcher.Watch(ctx, sidecar.WatchParams{Platform: src.GetPlatform(),
		AfterCursor: first[len(first)-2].GetCursor()}))
	defer stop()
	if f, err, ok := next(); !ok || err != nil || f.GetCursor() != first[len(first)-1].GetCursor() {
		return fmt.Errorf("the watch did not start after its cursor: %v %v", f, err)
	}
	words := make([]string, sc.Words)
	for i := range words {
		words[i] = strings.Repeat("x", sc.WordChars) + strconv.Itoa(i)
	}
	var published []int64
	for i := range sc.Turns { // the watch is not read meanwhile
		s := proto.Clone(src).(*sidecar.Source)
		s.ChatId = fmt.Sprintf("%s-%d", src.GetChatId(), i)
		frames, err := sidecar.Collect(producer.Prompt(ctx, sidecar.PromptParams{Source: s,
			Text: strings.Join(words, " "), Profile: sc.Profile}))
		if err != nil {
			return fmt.Errorf("turn %d: %w", i, err)
		}
		for _, f := range frames {
			published = append(published, f.GetCursor())
		}
	}
	time.Sleep(time.Duration(sc.PauseMS) * time.Millisecond)
	var got []int64
	for {
		f, err, ok := next()
		if !ok {
			return errors.New("the watch ended")
		}
		if err != nil {
			return fmt.Errorf("after %d of %d frames: %w", len(got), len(published), err)
		}
		got = append(got, f.GetCursor())
		if f.GetCursor() >= published[len(published)-1] {
			break
		}
	}
	if !slices.Equal(got, published) {
		return fmt.Errorf("%d frames read, %d published: a gap, a repeat or disorder", len(got), len(published))
	}
	if opens.Load() < 2 {
		return errors.New("the watch was never reopened: the sidecar did not cut it")
	}
	return nil
}
