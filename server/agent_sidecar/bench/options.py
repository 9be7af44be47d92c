"""A bench run's options, and what each point of the run is asked to do:
the calibration's turns (``calibration_spec``), the load of one level
(``point_spec``), its lanes' first turns spread over one ideal turn
(``ramp_for``) so that their prompts arrive evenly. Plain data
and arithmetic: nothing here connects or measures (run.py does).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import load, report
from .target import Target

DEFAULT_RAMP_S = 1.0  # --ramp auto with no ideal turn known (no --ideal, no calibration)


@dataclass
class BenchOptions:
    targets: tuple[Target, ...]  # one sidecar, or several (a cluster's nodes, or separate ones)
    text: str
    levels: list[int] = field(default_factory=lambda: [1])
    sweep: bool = False
    find_knee: int | None = None  # past the levels, up to this concurrency, until each knee is found
    repeat: int = 1  # rounds of the sweep, one after another (report: each round's knee and their median)
    clients: int = 1  # client processes driving the points (bench/fleet.py); 1: this one
    profile: str | None = None
    platform: str = "bench"
    sessions: int | None = None
    duration_s: float | None = 10.0
    turns: int | None = None
    warmup_s: float | None = None
    ramp_s: float | None = None  # None: auto (ramp_for)
    delivery: str = "queue"
    tools: bool = False
    compare_bare: bool = False
    bare_latency_ms: float | None = None
    bare_first_delay_ms: float = 0.0
    ideal_s: float | None = None
    slo: float = 0.10
    first_delta_slo_ms: float | None = None  # the SLO's bound on the first delta's p99 (None: none)
    calibrate: int = 3
    pid: int | None = None
    turn_timeout_s: float = 300.0
    seed: int = 1
    keep_sessions: bool = False  # leave the run's sessions in the target's store (bench/sessions.py)

    @property
    def target(self) -> Target:
        """The first target: the calibration's, and the bare server's kind of transport."""
        return self.targets[0]

    @property
    def session_count(self) -> int:
        """The sessions the run creates: ``sessions``, else enough for its
        largest level (``find_knee``'s, when it goes past the sweep)."""
        return self.sessions or max(self.levels + [self.find_knee or 0])


def ramp_for(opts: BenchOptions, calibration: dict | None) -> tuple[float, str]:
    """How long the lanes' first turns are spread over, and why: ``--ramp``
    when given; else one ideal turn as known before the points
    (report.ideal_before_points: ``--ideal``, else the calibration's median
    turn), else DEFAULT_RAMP_S.

    Why one turn: each lane starts its next turn when its last one ends, so
    the spread of the first starts is the spread of every later one. Lanes
    started within a second, with turns of four, send their prompts in a
    burst of four times the mean rate every turn and then nothing: the
    prompts' first deltas then queue behind each other, and the bursts' big
    commits make each delta cheaper than a steady load's do."""
    if opts.ramp_s is not None:
        return opts.ramp_s, "given (--ramp)"
    ideal = report.ideal_before_points(opts.ideal_s, calibration)
    if ideal is not None:
        return ideal[0], f"one ideal turn: {ideal[1]}"
    return DEFAULT_RAMP_S, "default (no ideal turn known)"


def point_spec(opts: BenchOptions, concurrency: int, ramp_s: float) -> load.LoadSpec:
    """The load of one point at ``concurrency`` lanes, its first turns spread over ``ramp_s``."""
    return load.LoadSpec(concurrency=concurrency, text=opts.text, duration_s=opts.duration_s, turns=opts.turns,
                         warmup_s=load.warmup_past_ramp(opts.warmup_s, ramp_s, concurrency, opts.turns is None),
                         ramp_s=ramp_s, delivery=opts.delivery, profile=opts.profile,
                         turn_timeout_s=opts.turn_timeout_s, resume_timeout_s=opts.target.connect_timeout_s)


def calibration_spec(opts: BenchOptions) -> load.LoadSpec:
    """The calibration: ``--calibrate`` turns one at a time on one lane, no ramp, warm-up auto (its first turn)."""
    return load.LoadSpec(concurrency=1, text=opts.text, duration_s=None, turns=opts.calibrate, warmup_s=None,
                         ramp_s=0, delivery=opts.delivery, profile=opts.profile,
                         turn_timeout_s=opts.turn_timeout_s, resume_timeout_s=opts.target.connect_timeout_s)
