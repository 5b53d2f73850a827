"""Request streams for the simulator: synthetic ShareGPT-like lengths and the Azure 2023 traces."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parents[3] / "data" / "azure"


@dataclass(frozen=True)
class Workload:
    """Requests in arrival (FCFS) order: prompt lengths, output lengths, the model's context limit.

    A request holds ``input + output`` tokens when it finishes (its final length), which never
    exceeds ``max_context`` (what the reserve-the-maximum policy reserves).
    """

    name: str
    input_lens: np.ndarray
    output_lens: np.ndarray
    max_context: int

    def __post_init__(self):
        inp = np.asarray(self.input_lens, dtype=np.int64)
        out = np.asarray(self.output_lens, dtype=np.int64)
        if inp.ndim != 1 or inp.shape != out.shape:
            raise ValueError(
                "input_lens and output_lens must be 1-D of one length, "
                f"got {inp.shape} and {out.shape}"
            )
        if inp.size and (inp.min() < 0 or out.min() < 1):
            raise ValueError(
                f"lengths must be input >= 0 and output >= 1, got min input {inp.min()}, "
                f"min output {out.min()}"
            )
        if inp.size and (inp + out).max() > self.max_context:
            i = int(np.argmax(inp + out))
            raise ValueError(
                f"request {i} ends at {inp[i] + out[i]} tokens, past max_context={self.max_context}"
            )
        object.__setattr__(self, "input_lens", inp)
        object.__setattr__(self, "output_lens", out)

    def __len__(self) -> int:
        return int(self.input_lens.size)

    @property
    def final_lens(self) -> np.ndarray:
        return self.input_lens + self.output_lens

    def head(self, n: int) -> Workload:
        """The first n requests (same context limit)."""
        return Workload(
            self.name, self.input_lens[:n], self.output_lens[:n], self.max_context
        )

    def describe(self) -> str:
        return (
            f"{self.name}: {len(self)} requests, mean input {self.input_lens.mean():.1f}, "
            f"mean output {self.output_lens.mean():.1f}, longest {self.final_lens.max()} tokens, "
            f"max_context {self.max_context}"
        )


def _lognormal_with_mean(z, sigma, mean, hi):
    """round(exp(mu + sigma * z)) clipped to [1, hi], with mu found by bisection so the clipped
    sample's mean is ``mean`` (clipping at the cap pulls a plain lognormal's mean down)."""
    lo_mu, hi_mu = np.log(mean) - 6 * sigma, np.log(mean) + 6 * sigma
    for _ in range(60):
        mu = 0.5 * (lo_mu + hi_mu)
        x = np.clip(np.rint(np.exp(mu + sigma * z)), 1, hi)
        lo_mu, hi_mu = (mu, hi_mu) if x.mean() < mean else (lo_mu, mu)
    return x.astype(np.int64)


def sharegpt_like(
    n: int = 20_000,
    seed: int = 0,
    mean_input: float = 161,
    mean_output: float = 338,
    max_total: int = 2048,
    sigma: float = 1.0,
) -> Workload:
    """Synthetic lengths with ShareGPT's means (vLLM paper: input 161, output 338 tokens).

    Input and output are independent lognormals (shape ``sigma`` = 1.0: heavy right tail, median
    about 0.6x the mean), rounded, at least 1 token, and capped so input + output <= max_total;
    the location of each is chosen so the capped sample's mean hits the target (to a fraction of a
    token). numpy's default_rng(seed) draws both.
    """
    if n < 1 or max_total < 2:
        raise ValueError(
            f"need n >= 1 and max_total >= 2, got n={n}, max_total={max_total}"
        )
    rng = np.random.default_rng(seed)
    z_in, z_out = rng.standard_normal((2, n))
    inp = _lognormal_with_mean(z_in, sigma, mean_input, max_total - 1)
    out = _lognormal_with_mean(z_out, sigma, mean_output, max_total - inp)
    return Workload(f"ShareGPT-like (seed {seed})", inp, out, max_total)


def load_azure(
    kind: str = "conv", n: int | None = None, max_context: int | None = None
) -> Workload:
    """The Azure LLM inference trace 2023 (``kind`` 'conv' or 'code'; CC-BY 4.0, see data/azure/).

    ContextTokens become input lengths and GeneratedTokens output lengths, in arrival order
    (timestamps are dropped: the simulator replays a saturated queue). ``max_context`` defaults to
    the longest request in the file, the most generous limit a reserve-the-maximum engine could use.
    """
    if kind not in ("conv", "code"):
        raise ValueError(f"kind must be 'conv' or 'code', got {kind!r}")
    with gzip.open(DATA_DIR / f"azure_llm_2023_{kind}.csv.gz", "rt") as f:
        rows = np.loadtxt(
            f, delimiter=",", skiprows=1, usecols=(1, 2), dtype=np.int64, ndmin=2
        )
    longest = int(rows.sum(1).max())
    rows = rows[:n] if n is not None else rows
    return Workload(
        f"Azure 2023 {kind}", rows[:, 0], rows[:, 1], max_context or longest
    )


def load_azure_arrivals(kind: str = "conv", n: int | None = None) -> np.ndarray:
    """Arrival times of the first ``n`` requests of an Azure 2023 trace (all when None), in
    seconds after the first one (its TIMESTAMP column, which ``load_azure`` drops)."""
    if kind not in ("conv", "code"):
        raise ValueError(f"kind must be 'conv' or 'code', got {kind!r}")
    with gzip.open(DATA_DIR / f"azure_llm_2023_{kind}.csv.gz", "rt") as f:
        next(f)  # the header
        stamps = [line.split(",", 1)[0] for _, line in zip(range(n or 1 << 62), f)]
    # "2023-11-16 18:15:46.6805900": numpy reads the ISO form to the microsecond
    t = np.array([s.replace(" ", "T")[:26] for s in stamps], dtype="datetime64[us]")
    return (t - t[0]).astype(np.int64) / 1e6


# the names load_workload knows
WORKLOADS = ("ShareGPT-like", "Azure 2023 conv", "Azure 2023 code")


def load_workload(name: str, n: int) -> Workload:
    """The first ``n`` requests of a workload by its name in WORKLOADS (chapter 10's explorer)."""
    if name == "ShareGPT-like":
        return sharegpt_like(n)
    kinds = {"Azure 2023 conv": "conv", "Azure 2023 code": "code"}
    if name not in kinds:
        raise ValueError(f"unknown workload {name!r}; known: {WORKLOADS}")
    return load_azure(kinds[name], n=n)
