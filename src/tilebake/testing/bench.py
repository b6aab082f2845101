"""Benchmark and test-id helpers: parameter ids that name a test case (and key its benchmark
baseline), the cast options of a parameter dict, and silencing of noisy native output."""

from __future__ import annotations

import os
import sys

__all__ = ["empty_suppress", "format_param_id", "get_cast_params", "make_param_id", "suppress_stdout_stderr"]


class empty_suppress:
    """A context manager that does nothing: the stand-in for suppress_stdout_stderr."""

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return None


class suppress_stdout_stderr:
    """Send stdout and stderr to /dev/null, at the file-descriptor level too, so output written
    by native code (compilers, drivers) is silenced along with Python's."""

    def __enter__(self):
        self._sink = open(os.devnull, "w")
        self._streams = (sys.stdout, sys.stderr)
        for stream in self._streams:
            stream.flush()
        # Descriptors 1 and 2 themselves: native code writes there whatever sys.stdout is
        # (under pytest's capture it is another object, with another descriptor or none).
        self._saved = [(fd, os.dup(fd)) for fd in (1, 2)]
        for fd, _ in self._saved:
            os.dup2(self._sink.fileno(), fd)
        sys.stdout = sys.stderr = self._sink
        return self

    def __exit__(self, *_):
        sys.stdout, sys.stderr = self._streams
        for fd, saved in reversed(self._saved):
            os.dup2(saved, fd)
            os.close(saved)
        self._sink.close()
        return None


# The option names get_cast_params copies, in this order.
_CAST_PARAM_KEYS = ("round_sf", "use_packed_ue8m0", "use_tma_aligned_col_major_sf")


def get_cast_params(params: dict) -> dict:
    """The cast options (round_sf, use_packed_ue8m0, use_tma_aligned_col_major_sf) params holds."""
    return {key: params[key] for key in _CAST_PARAM_KEYS if key in params}


# Shorter names in ids, and the other way round.
_SHORT_NAMES = {
    "num_ep_ranks": "ep",
    "num_experts": "experts",
    "use_tma_aligned_col_major_sf": "col",
    "use_packed_ue8m0": "ue8m0",
    "use_e4m3_sf": "e4m3sf",
    "round_sf": "round",
}
_LONG_NAMES = {short: long for long, short in _SHORT_NAMES.items()}

# Value widths for aligned (display) ids, by long name; booleans always get 5 ("False").
_DISPLAY_WIDTHS = {
    "num_tokens": 5,
    "num_ep_ranks": 2,
    "num_experts": 3,
    "hidden": 4,
    "use_tma_aligned_col_major_sf": 1,
    "use_packed_ue8m0": 1,
    "use_e4m3_sf": 1,
    "round_sf": 1,
    "num_per_channels": 4,
    "numel": 9,
    "num_rows": 7,
    "head_dim": 3,
    "nesterov": 5,
}


def _field(name: str, value: str, display: bool) -> str:
    """One "name=value," field; for display, padded so columns line up across ids."""
    text = f"{name}={value},"
    if not display:
        return text
    width = _DISPLAY_WIDTHS.get(_LONG_NAMES.get(name, name))
    if width is None:
        return text
    if value in ("True", "False"):
        width = 5
    width = max(width, len(value))
    return text.ljust(len(name) + width + 2)


def make_param_id(params: dict, display: bool = False) -> str:
    """A test id from a parameter dict: "name=value," per entry that is not None, in dict order,
    with the long option names shortened (num_ep_ranks -> ep, round_sf -> round, ...).
    Used as pytest's `ids=`; display=True pads the values into columns for reports."""
    return "".join(_field(_SHORT_NAMES.get(k, k), str(v), display) for k, v in params.items() if v is not None)


def format_param_id(param_id: str, display: bool = False) -> str:
    """Re-render an id make_param_id made (or a plain pytest id): each comma-separated field
    again ends in a comma, padded when display is set; fields without "=" pass through."""
    out = []
    for field in param_id.split(","):
        if not field:
            continue
        name, sep, value = field.partition("=")
        out.append(_field(name, value, display) if sep else f"{field},")
    return "".join(out)
