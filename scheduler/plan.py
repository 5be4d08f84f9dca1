"""What the scheduler hands the runtime: a Plan of generated Triton kernels, plain
JSON-able, with everything `launch` needs (no IR objects, no egglog, no z3)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Buffer:
    """A tensor the plan reads or writes: a graph input, a graph output or an
    intermediate between two kernels. `shape` holds dim expressions over symbols."""
    name: str
    shape: list[str]
    dtype: str  # IR dtype name

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, d: dict) -> "Buffer":
        return cls(d["name"], list(d["shape"]), d["dtype"])


@dataclass
class Kernel:
    """One generated kernel. `args` lists the launch arguments in order: buffer names
    (passed as tensors), then symbol names (ints). Block sizes are literals in the
    source; num_warps and num_stages are passed at launch. `descriptors` lists the
    TMA descriptor arguments, [argument, buffer, block shape]: args name them after the
    buffers, and the source then ends with a `TMA` constexpr that the launcher sets
    (False, with None descriptors, when a call's tensors break TMA's alignment rules).
    `programs_per_sm` > 0 marks a persistent kernel: `grid` counts its tiles, and the
    launcher starts min(tiles, SMs x programs_per_sm) programs that loop over them."""
    name: str
    source: str
    grid: list[str]
    args: list[str]
    num_warps: int = 4
    num_stages: int = 2
    descriptors: list = field(default_factory=list)
    programs_per_sm: int = 0
    # Each loop over a label's tiles, as the scheduler bounded it (bounds.loop_record):
    # {"label", "extent", "lo", "hi", "loaded": {"lo"/"hi": [graph inputs]}, "fraction", "relative",
    # "trips": {grid label: how the trip count moves as its tile id grows}}. Plain data, read
    # by tests and `cleave explain`-style tools; launch does not need it.
    loops: list = field(default_factory=list)
    # > 0: more warps than this only unpipelined (one stage), where triton miscompiles the
    # pipelined loop (kernel_stats.Stats.side_reduction); the runtime's tuning keeps to it
    max_pipelined_warps: int = 0
    # [buffer, groups]: the kernel runs a split's combine in the last program of each group
    # to finish (combine.py), counting arrivals in an int32 buffer of `groups` slots (an
    # expression like `grid`) that the launcher passes as the argument `buffer`, zero
    # before the launch; the kernel leaves it zero again
    arrivals: list = field(default_factory=list)
    # False: no tl.dot, so Triton pipelines none of its loops and it launches with one
    # stage only (kernel_stats.Stats.pipelined); the runtime's tuning tries no others
    pipelined: bool = True
    # the stage counts worth launching it with, ascending (kernel_stats.Stats.stage_choices;
    # empty: any): neither the scheduler nor the runtime's tuning tries others
    stage_choices: tuple = ()
    # "gluon": the source is a Gluon kernel (scheduler/gluon.py), run only on an sm_90 GPU
    # whose Triton has Gluon, after a check of its output against the `tl` plan's
    dialect: str = "triton"
    # a Gluon kernel's `tl` twin, with the same arguments: what runs where Gluon does not
    fallback: "Kernel | None" = None

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source, "grid": list(self.grid), "args": list(self.args),
                "num_warps": self.num_warps, "num_stages": self.num_stages,
                "descriptors": [list(d) for d in self.descriptors], "programs_per_sm": self.programs_per_sm,
                "loops": list(self.loops), "max_pipelined_warps": self.max_pipelined_warps,
                "arrivals": list(self.arrivals), "pipelined": self.pipelined,
                "stage_choices": list(self.stage_choices), "dialect": self.dialect,
                "fallback": self.fallback.to_json() if self.fallback else None}

    def launches(self, num_warps: int, num_stages: int) -> bool:
        """Whether this launch configuration is one the kernel may run with."""
        if (num_stages > 1 and not self.pipelined) or (self.stage_choices and num_stages not in self.stage_choices):
            return False
        return not (self.max_pipelined_warps and num_warps > self.max_pipelined_warps and num_stages > 1)

    @classmethod
    def from_json(cls, d: dict) -> "Kernel":
        return cls(d["name"], d["source"], list(d["grid"]), list(d["args"]), d["num_warps"], d["num_stages"],
                   [list(x) for x in d.get("descriptors", [])], d.get("programs_per_sm", 0),
                   loops=list(d.get("loops", [])), max_pipelined_warps=d.get("max_pipelined_warps", 0),
                   arrivals=list(d.get("arrivals", [])), pipelined=d.get("pipelined", True),
                   stage_choices=tuple(d.get("stage_choices", ())), dialect=d.get("dialect", "triton"),
                   fallback=cls.from_json(d["fallback"]) if d.get("fallback") else None)


@dataclass
class Plan:
    """A ranked schedule of one candidate: kernels in launch order. `graph` is the
    candidate's text form (the runtime binds symbols through it); `env` the binding it
    was scheduled at; symbols in `dynamic` are read from the tensors at each launch.
    `requires` holds the candidate's constraints as (integer-code check, why) pairs:
    a plan over dynamic extents serves only the shapes where they hold (a split count
    that would leave a chunk empty), and launch checks them."""
    graph: str
    kernels: list[Kernel]
    inputs: list[Buffer]
    outputs: list[Buffer]
    intermediates: list[Buffer]
    split: dict[str, int]
    tiles: dict[str, int]
    cost: float
    dynamic: list[str]
    env: dict[str, int]
    requires: list[tuple[str, str]] = field(default_factory=list)

    def fits(self, env: dict[str, int]) -> str | None:
        """None when every requirement holds at env (symbols incl. split counts), else
        the first that fails, as text."""
        from .exprs import evaluate

        for check, why in self.requires:
            if not evaluate(check, env):
                return f"{check} (from {why})"
        return None

    def to_json(self) -> dict:
        return {"graph": self.graph, "kernels": [k.to_json() for k in self.kernels],
                "inputs": [b.to_json() for b in self.inputs], "outputs": [b.to_json() for b in self.outputs],
                "intermediates": [b.to_json() for b in self.intermediates], "split": dict(self.split),
                "tiles": dict(self.tiles), "cost": self.cost, "dynamic": list(self.dynamic), "env": dict(self.env),
                "requires": [list(r) for r in self.requires]}

    @classmethod
    def from_json(cls, d: dict) -> "Plan":
        if not isinstance(d, dict):
            raise TypeError(f"Plan.from_json takes the dict Plan.to_json gives (json.loads of its text), "
                            f"got a {type(d).__name__}")
        missing = [k for k in _PLAN_KEYS if k not in d]
        if missing:
            raise ValueError(f"Plan.from_json: the dict lacks {', '.join(map(repr, missing))} (not a plan's JSON)")
        return cls(d["graph"], [Kernel.from_json(k) for k in d["kernels"]],
                   [Buffer.from_json(b) for b in d["inputs"]], [Buffer.from_json(b) for b in d["outputs"]],
                   [Buffer.from_json(b) for b in d["intermediates"]], dict(d["split"]), dict(d["tiles"]),
                   float(d["cost"]), list(d["dynamic"]), dict(d["env"]),
                   [tuple(r) for r in d.get("requires", [])])


_PLAN_KEYS = ("graph", "kernels", "inputs", "outputs", "intermediates", "split", "tiles", "cost", "dynamic", "env")
