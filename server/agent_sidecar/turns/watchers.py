"""The frame bus's watches by session key and by platform (WatchActivity):
each committed frame is handed to the watchers of its key and platform; a
watcher that falls behind its bound leaves (see Subscriber). FrameBus
(frames.py) feeds them its own commits, or in a cluster the cluster tail
(cluster/tail.py) feeds them every node's frames in cursor order."""

from __future__ import annotations

from .subscriber import StreamedFrame, Subscriber


class Watchers:
    """``buffer_frames``/``buffer_bytes``: every stream's queue bounds."""

    def __init__(self, buffer_frames: int, buffer_bytes: int):
        self.buffer_frames, self.buffer_bytes = buffer_frames, buffer_bytes  # per Subscriber
        self.by_key: dict[str, set[Subscriber]] = {}
        self.by_platform: dict[str, set[Subscriber]] = {}
        # [cluster] False when several sidecars share the store: the cluster tail
        # (cluster/tail.py) feeds by_key/by_platform every node's frames, this
        # node's too, in cursor order; the bus then serves only turns' own streams.
        self.feeds_watchers = True
        # The highest cursor handed to watchers (in a cluster, read past by the
        # tail): where a live watch starts, told to its client (PromptService._watch).
        self.watch_head = 0
        self._watches_ended: BaseException | None = None  # end_watches

    def to_watchers(self, item: StreamedFrame, key: str, platform: str) -> None:
        """Hand a committed frame to the watchers of its key and platform
        (every frame passes here: with nobody watching it is two lookups)."""
        if item.frame.cursor > self.watch_head:
            self.watch_head = item.frame.cursor
        subs = self.by_key.get(key)
        if subs:
            self._push(subs, self.by_key, key, item)
        subs = self.by_platform.get(platform)
        if subs:
            self._push(subs, self.by_platform, platform, item)

    def _push(self, subs: set[Subscriber], index: dict[str, set[Subscriber]], name: str,
              item: StreamedFrame) -> None:
        for sub in tuple(subs):
            if not sub.push(item):
                self.unwatch(index, name, sub)

    def subscriber(self) -> Subscriber:
        """A new stream's queue, with the configured bounds."""
        return Subscriber(self.buffer_frames, self.buffer_bytes)

    def watch(self, index: dict[str, set[Subscriber]], name: str) -> Subscriber:
        sub = self.subscriber()
        if self._watches_ended is not None:  # the sidecar stops: no new watch waits on it
            sub.push(self._watches_ended)
        index.setdefault(name, set()).add(sub)
        return sub

    def end_watches(self, err: BaseException) -> None:
        """The sidecar stops (after its drain): every watch by key or
        platform, and any opened from now on, ends with ``err`` (UNAVAILABLE,
        with its reason), not with gRPC's bare cancel at the server's stop."""
        self._watches_ended = err
        for index in (self.by_key, self.by_platform):
            for subs in index.values():
                for sub in subs:
                    sub.push(err)

    def unwatch(self, index: dict[str, set[Subscriber]], name: str, sub: Subscriber) -> None:
        subs = index.get(name)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del index[name]

