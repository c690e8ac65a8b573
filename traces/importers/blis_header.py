"""The header of a BLIS TraceV2/v3 trace (``blis observe``'s ``--trace-header`` YAML) and
the pairing of header and data files; the format and its sources are described in
:mod:`traces.importers.blis_observe`."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from ..errors import TraceFormatError

__all__ = ["read_blis_header", "blis_file_pair", "ENGINE_KEYS"]

#: header ``server.<key>`` -> (vLLM's / replay's name, type, minimum): the engine settings.
ENGINE_KEYS = {"tensor_parallel": ("tensor_parallel_size", int, 1), "max_num_seqs": ("max_num_seqs", int, 1),
               "block_size": ("block_size", int, 1), "gpu_memory_utilization": ("gpu_memory_utilization", float, 0),
               "max_model_len": ("max_model_len", int, 1)}
_HEADER_KEYS = {"trace_version", "time_unit", "created_at", "mode", "warm_up_requests", "workload_seed",
                "workload_spec", "server", "network", "goodput_slo_targets"}
_TIME_UNITS = ("us", "microseconds")
_MODES = ("real", "generated", "replayed")


def blis_file_pair(path: str | Path, data: str | Path | None = None) -> tuple[Path, Path]:
    """The (header YAML, data CSV) pair of a TraceV2 trace.

    ``path`` is the header (or, without ``data``, either file); the other one is the file
    of the same name with ``.csv`` (for a header) or ``.yaml`` / ``.yml`` (for a CSV), as in
    BLIS's ``--trace-header trace.yaml --trace-data trace.csv``.

    Raises
    ------
    TraceFormatError
        ``path`` or the partner file does not exist.
    """
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(path, "cannot open (No such file or directory)")
    if data is not None:
        if path.suffix.lower() == ".csv":
            raise TraceFormatError(path, "is a CSV file, given with --data", expected="the header YAML "
                                   "(blis observe --trace-header) as FILE")
        return path, Path(data)
    if path.suffix.lower() == ".csv":
        for suffix in (".yaml", ".yml"):
            if path.with_suffix(suffix).is_file():
                return path.with_suffix(suffix), path
        raise TraceFormatError(path, f"has no header beside it ({path.with_suffix('.yaml').name} not found)",
                               expected="the --trace-header YAML of blis observe as FILE, with this CSV as --data")
    if path.with_suffix(".csv").is_file() and path.with_suffix(".csv") != path:
        return path, path.with_suffix(".csv")
    raise TraceFormatError(path, f"has no data file beside it ({path.with_suffix('.csv').name} not found)",
                           expected="--data PATH, the --trace-data CSV of blis observe")


def _key_lines(node, prefix="") -> dict[str, int]:
    """Dotted key -> 1-based line, for the mappings of a composed YAML document."""
    out = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            name = f"{prefix}{k.value}"
            out[name] = k.start_mark.line + 1
            out.update(_key_lines(v, name + "."))
    return out


def _number(path, value, key, lines, typ=float, minimum=None):
    try:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and bool(np.isfinite(float(value)))
        ok = ok and (typ is float or (float(value) == int(value) and abs(int(value)) < 2 ** 63))
    except OverflowError:
        ok = False
    if not ok or (minimum is not None and value < minimum):
        words = "a whole number" if typ is int else "a number"
        bound = f" >= {minimum:g}" if minimum is not None else ""
        raise TraceFormatError(path, f"value {value!r:.40} is not {words}{bound}",
                               column=key, line=lines.get(key))
    return typ(value)


def _mapping(path, value, key, lines) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TraceFormatError(path, f"is a {type(value).__name__}", column=key, line=lines.get(key),
                               expected="a mapping of key: value pairs")
    return value


def read_blis_header(path: str | Path) -> tuple[dict, dict]:
    """Read and check a TraceV2 header.

    Returns
    -------
    header : dict
        The YAML as read (a mapping).
    metadata : dict of str
        ``blis_trace_version``, ``blis_mode``, ``warm_up_requests``, ``model``,
        ``server_type``, ``network_rtt_s`` (s), ``created_at``, ``workload_spec``,
        ``engine_settings`` and ``engine_settings_sources`` (JSON, vLLM's names: replay takes
        them as the defaults of its engine options), ``goodput_slo_targets`` (JSON, ms as
        written), ``blis_unknown_header_keys`` (keys this reader does not know; ignored).

    Raises
    ------
    TraceFormatError
        Naming the header, the line and the key: not YAML, not a mapping, a missing or
        unsupported ``trace_version`` (2 or 3), ``time_unit`` (us) or ``mode``, a v3 field in
        a version-2 header, a value of the wrong type.
    """
    path = Path(path)
    head, lines = _load(path)
    version = _check_header(path, head, lines)
    meta = {"blis_trace_version": str(version), "blis_mode": head["mode"],
            "warm_up_requests": str(_number(path, head.get("warm_up_requests", 0) or 0, "warm_up_requests", lines,
                                            int, 0))}
    for key in ("created_at", "workload_spec"):
        if head.get(key) is not None:
            meta[key] = str(head[key])
    server = _mapping(path, head.get("server"), "server", lines)
    meta.update(_server_settings(path, server, lines))
    for key, name in (("model", "model"), ("type", "server_type")):
        if server.get(key):
            meta[name] = str(server[key])
    network = _mapping(path, head.get("network"), "network", lines)
    if network.get("measured_rtt_ms"):
        rtt = _number(path, network["measured_rtt_ms"], "network.measured_rtt_ms", lines, float, 0)
        meta["network_rtt_s"] = repr(rtt / 1e3)
    targets = {}
    for cls, dims in _mapping(path, head.get("goodput_slo_targets"), "goodput_slo_targets", lines).items():
        key = f"goodput_slo_targets.{cls}"
        targets[str(cls)] = {d: _number(path, v, f"{key}.{d}", lines, float, 0)
                             for d, v in _mapping(path, dims, key, lines).items() if v is not None}
    if targets:
        meta["goodput_slo_targets"] = json.dumps(targets, sort_keys=True)
    unknown = sorted(str(k) for k in head if k not in _HEADER_KEYS)
    if unknown:
        meta["blis_unknown_header_keys"] = ",".join(unknown)
    return head, meta


def _load(path: Path) -> tuple:
    """The header's YAML and the line of each key (dotted for nested ones); unreadable text or YAML refused."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except IsADirectoryError:
        raise TraceFormatError(path, "is a directory", expected="a file") from None
    except OSError as exc:
        raise TraceFormatError(path, f"cannot open ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise TraceFormatError(path, "is not UTF-8 text", expected="the YAML header of blis observe") from None
    try:
        head = yaml.safe_load(text)
        lines = _key_lines(yaml.compose(text)) if isinstance(head, dict) else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise TraceFormatError(path, f"not valid YAML ({getattr(exc, 'problem', None) or 'unreadable'})",
                               line=mark.line + 1 if mark is not None else None) from None
    except RecursionError:
        raise TraceFormatError(path, "YAML nested too deeply", expected="the YAML header of blis observe") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise TraceFormatError(path, f"not valid YAML ({str(exc).splitlines()[0][:80]})",
                               expected="numbers of ordinary size") from None
    return head, lines


def _check_header(path: Path, head, lines: dict):
    """Refuse a header that is not a TraceV2/V3 mapping in microseconds with a known mode; return its version."""
    if not isinstance(head, dict):
        raise TraceFormatError(path, "is not a YAML mapping", expected="the --trace-header YAML of blis observe "
                               "(trace_version, time_unit, mode, ...); give the CSV with --data")
    for key in ("trace_version", "time_unit", "mode"):
        if key not in head:
            raise TraceFormatError(path, "missing key", column=key, expected="a TraceV2 header (blis observe)")
    version = head["trace_version"]
    if version not in (2, 3) or isinstance(version, bool):
        raise TraceFormatError(path, f"trace_version {version!r:.40} is not supported", column="trace_version",
                               line=lines.get("trace_version"), expected="2 or 3")
    if head["time_unit"] not in _TIME_UNITS:
        raise TraceFormatError(path, f"time_unit {head['time_unit']!r:.40} is not microseconds", column="time_unit",
                               line=lines.get("time_unit"), expected="us or microseconds (the *_us columns)")
    if head["mode"] not in _MODES:
        raise TraceFormatError(path, f"mode {head['mode']!r:.40} is unknown", column="mode", line=lines.get("mode"),
                               expected=" or ".join(_MODES))
    if version == 2 and head.get("goodput_slo_targets") is not None:
        raise TraceFormatError(path, "a version-2 header has goodput_slo_targets (added in version 3)",
                               column="goodput_slo_targets", line=lines.get("goodput_slo_targets"),
                               expected="trace_version: 3")
    return version


def _server_settings(path: Path, server: dict, lines: dict) -> dict:
    """The metadata of the engine settings the header's ``server`` records (none: empty), with their sources."""
    settings, sources = {}, {}
    for key, (name, typ, minimum) in ENGINE_KEYS.items():
        if server.get(key) is None or server.get(key) == 0:
            continue  # BLIS omits zero fields: not recorded
        settings[name] = _number(path, server[key], f"server.{key}", lines, typ, minimum)
        sources[name] = f"BLIS trace header server.{key}"
    if settings.get("gpu_memory_utilization", 0) > 1:
        raise TraceFormatError(path, f"value {settings['gpu_memory_utilization']!r} is above 1",
                               column="server.gpu_memory_utilization",
                               line=lines.get("server.gpu_memory_utilization"), expected="a fraction in (0, 1]")
    if not settings:
        return {}
    return {"engine_settings": json.dumps(settings), "engine_settings_sources": json.dumps(sources)}
