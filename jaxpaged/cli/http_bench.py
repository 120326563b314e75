"""``jaxpaged bench serving --backend=http``: drive a running server with a request set and report.

The flags here choose the request set (``--dataset_name``), the arrival
process (``--request_rate`` from jaxpaged/cli/workload_flags.py, ``--burstiness``),
``--max_concurrency`` and the goodput SLOs; :func:`run_from_flags` sends the
requests and summarizes them (`jaxpaged.bench.online.http_run`) and writes
JSON and Markdown.
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxpaged.bench.online.arrivals import arrival_offsets
from jaxpaged.bench.online.datasets import PROMPT_FORMATS, BenchRequest
from jaxpaged.bench.online.http_run import DATASETS, RequestSet, run_http_benchmark
from jaxpaged.bench.online.online_client import fetch_model_name
from jaxpaged.bench.online.online_metrics import parse_goodput
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.cli.workload_flags import WorkloadFlags


class HttpBenchFlags:
    """The HTTP benchmark's request-set, arrival, concurrency and SLO flags, and the run they describe."""

    def __init__(self, fs: FlagSet, wl: WorkloadFlags) -> None:
        """Define the flags on ``fs``."""
        self.wl = wl
        self.BASE_URL = fs.DEFINE_string("base_url", "http://127.0.0.1:8000", "server to drive (--backend=http)")
        self.SERVED_MODEL = fs.DEFINE_string("served_model_name", None,
                                           "model name sent in requests (default: the first of GET /v1/models)")
        self.TOKENIZER = fs.DEFINE_string("tokenizer", None,
                                        "config name or checkpoint directory whose tokenizer measures text prompts "
                                        "(default: --model)")
        self.DATASET = fs.DEFINE_enum("dataset_name", "workload", DATASETS,
                                    "request set: a jaxpaged --workload, random, prefix_repetition or sharegpt")
        self.DATASET_PATH = fs.DEFINE_string("dataset_path", None, "ShareGPT-format JSON file (--dataset_name=sharegpt)")
        self.PROMPT_FORMAT = fs.DEFINE_enum("prompt_format", None, PROMPT_FORMATS,
                                          "send prompts as token ids or text (default: as the dataset has them)")
        self.RANDOM_INPUT = fs.DEFINE_integer("random_input_len", 1024, "prompt tokens (random)")
        self.RANDOM_OUTPUT = fs.DEFINE_integer("random_output_len", 128, "generated tokens (random)")
        self.RANDOM_RANGE = fs.DEFINE_float("random_range_ratio", 0.0, "lengths vary uniformly within +- this fraction (random)")
        self.PREFIX_LEN = fs.DEFINE_integer("prefix_repetition_prefix_len", 256, "shared prefix tokens (prefix_repetition)")
        self.SUFFIX_LEN = fs.DEFINE_integer("prefix_repetition_suffix_len", 256, "unique suffix tokens (prefix_repetition)")
        self.NUM_PREFIXES = fs.DEFINE_integer("prefix_repetition_num_prefixes", 10, "distinct prefixes (prefix_repetition)")
        self.PREFIX_OUTPUT = fs.DEFINE_integer("prefix_repetition_output_len", 128, "generated tokens (prefix_repetition)")
        self.SHAREGPT_OUTPUT = fs.DEFINE_integer("sharegpt_output_len", None,
                                               "generated tokens per ShareGPT request (default: its reply's length)")
        self.BURSTINESS = fs.DEFINE_float("burstiness", 1.0, "gamma shape of inter-arrival gaps: 1 = Poisson, < 1 burstier")
        self.MAX_CONCURRENCY = fs.DEFINE_integer("max_concurrency", None, "most requests in flight (default: unlimited)")
        self.GOODPUT = fs.DEFINE_multi_string("goodput", [], "SLOs in ms, e.g. --goodput=ttft:200,tpot:50 (or repeated)")
        self.IGNORE_EOS = fs.DEFINE_boolean("ignore_eos", True, "generate exactly the requested output length")
        self.TIMEOUT = fs.DEFINE_float("request_timeout_s", 600.0, "give up on a request after this long")
        fs.DEFINE_alias("num_prompts", "num_requests")
        fs.positive("random_input_len", "random_output_len", "prefix_repetition_prefix_len",
                             "prefix_repetition_suffix_len", "prefix_repetition_num_prefixes", "prefix_repetition_output_len",
                             "sharegpt_output_len", "max_concurrency")
        fs.register_validator("random_range_ratio", lambda v: 0 <= v < 1, message="--random_range_ratio must be in [0, 1)")
        fs.register_validator("burstiness", lambda v: 0 < v < float("inf"),
                                 message="--burstiness must be a positive finite number")
        fs.register_validator("request_timeout_s", lambda v: v > 0, message="--request_timeout_s must be positive")

    def request_set(self) -> RequestSet:
        """The request set the flags describe (the tokenizer: ``--tokenizer``, else ``--model``)."""
        return RequestSet(
            self.DATASET.value, self.wl.NUM_REQUESTS.value, self.wl.SEED.value, random_input_len=self.RANDOM_INPUT.value,
            random_output_len=self.RANDOM_OUTPUT.value, random_range_ratio=self.RANDOM_RANGE.value,
            prefix_len=self.PREFIX_LEN.value, suffix_len=self.SUFFIX_LEN.value, num_prefixes=self.NUM_PREFIXES.value,
            prefix_output_len=self.PREFIX_OUTPUT.value, dataset_path=self.DATASET_PATH.value,
            sharegpt_output_len=self.SHAREGPT_OUTPUT.value, max_total_len=self.wl.MAX_MODEL_LEN.value or 2048,
            prompt_format=self.PROMPT_FORMAT.value, tokenizer=self.TOKENIZER.value or self.wl.MODEL.value)

    def requests_from_flags(self, workload: str) -> list[BenchRequest]:
        """The requests: ``--trace``, else the jaxpaged workload ``workload`` (``--dataset_name=workload``), else
        the dataset."""
        if self.wl.TRACE.value:
            return self.request_set().build(self.wl.trace_from_flags())
        if self.DATASET.value == "workload":
            return self.request_set().build(self.wl.workload_from_flags(workload))
        return self.request_set().build()

    def offsets_from_flags(self, num_requests: int) -> list[float]:
        """Arrival offsets (seconds) from ``--request_rate``, ``--burstiness`` and ``--seed``."""
        return arrival_offsets(num_requests, self.wl.REQUEST_RATE.value, burstiness=self.BURSTINESS.value,
                               seed=self.wl.SEED.value).tolist()

    def goodput_from_flags(self, extra_args: Sequence[str] = ()) -> dict[str, float]:
        """``--goodput`` SLOs; ``extra_args`` are leftover positional arguments, so ``--goodput ttft:1 tpot:2`` works."""
        if extra_args and not self.GOODPUT.value:
            raise ValueError(f"unexpected arguments {list(extra_args)}")
        return parse_goodput([*self.GOODPUT.value, *extra_args])

    def run_from_flags(self, workload: str, out: OutputFlags, *, extra_args: Sequence[str] = (),
                       progress: bool = True) -> dict:
        """Run the HTTP benchmark the flags describe against ``--base_url``; print, write and return the result."""
        slos = self.goodput_from_flags(extra_args)
        model = self.SERVED_MODEL.value or fetch_model_name(self.BASE_URL.value)
        requests = self.requests_from_flags(workload)
        if self.wl.TRACE.value:  # the trace's own (time-scaled) arrivals
            offsets = [r.arrival_time for r in self.wl.trace_from_flags()]
        else:
            offsets = self.offsets_from_flags(len(requests))
        run = run_http_benchmark(self.BASE_URL.value, model, requests, offsets, goodput_slos=slos,
                                 max_concurrency=self.MAX_CONCURRENCY.value, ignore_eos=self.IGNORE_EOS.value,
                                 timeout_s=self.TIMEOUT.value, progress=progress)
        result = {"backend": "http", "base_url": self.BASE_URL.value, "model": model,
                  "dataset_name": "trace" if self.wl.TRACE.value else self.DATASET.value, "trace": self.wl.TRACE.value,
                  "workload": workload if self.DATASET.value == "workload" else None, "num_requests": len(requests),
                  "request_rate": self.wl.REQUEST_RATE.value, "burstiness": self.BURSTINESS.value,
                  "max_concurrency": self.MAX_CONCURRENCY.value, "goodput_slos_ms": slos} | run.report()
        out.write(result, run.table())
        return result
