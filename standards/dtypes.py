"""Per-dtype constants of the precision standards, in one place.

Why a module of its own: every standard needs "how precise can D be" (mantissa bits,
smallest normal exponent, largest finite value) and the spec's per-dtype thresholds.
Keeping them together makes the numbers auditable against the spec in one read.
The values marked "spec" are msprobe's facts; fp8 and float64 rows are ours, derived the
same way from the format (rtol = one ulp at the bottom of a binade, small = smallest
normal, small_atol = smallest subnormal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import torch

#: An array of the standards: of the device's dtype (float16 ... float64, integers, bool)
#: or the bench's float64, of any shape; Any: the dtype is the call's, known at run time.
Array: TypeAlias = np.ndarray[Any, np.dtype[Any]]
#: what names a dtype: a torch or numpy dtype, a numpy scalar type, or a name ("fp16")
DtypeLike: TypeAlias = (
    "torch.dtype | np.dtype[Any] | type[np.generic] | type[float] | str"  # np.dtype[Any]: any numpy dtype
)

__all__ = ["DtypeInfo", "dtype_info", "dtype_name", "is_float_name", "DTYPES"]


@dataclass(frozen=True)
class DtypeInfo:
    """Format facts and default thresholds of one device dtype."""

    name: str  # canonical name: "float32", "bfloat16", "float8_e4m3fn" ...
    mantissa_bits: int  # m(D): stored fraction bits
    e_min: int  # exponent of the smallest normal number
    max_finite: float  # largest finite value (clip target for inf/nan agreement)
    torch_dtype: torch.dtype  # the torch dtype used to round a bench to D
    defaults: dict[str, float]  # threshold name -> default value for this dtype

    @property
    def eps(self) -> float:
        """Machine epsilon 2**-m."""
        return 2.0**-self.mantissa_bits


@dataclass(frozen=True, kw_only=True)
class _Row:
    """The thresholds that differ by dtype: one row of the table (DTYPES below); the rest
    of a dtype's defaults are the same for every dtype (`defaults`)."""

    small: float
    rtol: float
    small_atol: float
    ulp_threshold: float
    ulp_floor: float
    ulp_prop_max: float
    bound: float
    eb_max: float
    atol_bm: float
    sr_max_scaled_ulp: float
    sr_mean_scaled_ulp: float
    sr_bias_ulp: float = 0.2
    sr_thousandth_ulp: float = 4.0
    at_bias_ulp: float = 0.2
    ulp_bias_ulp: float = 0.2

    def defaults(self) -> dict[str, float]:
        """Every threshold's default for the dtype (DtypeInfo.defaults), by name."""
        return {
            # absolute threshold (spec 2)
            "rtol": self.rtol,
            "small": self.small,
            "small_atol": self.small_atol,
            # ULP (spec 3)
            "ulp_threshold": self.ulp_threshold,
            "ulp_floor": self.ulp_floor,
            "ulp_prop_max": self.ulp_prop_max,
            "ulp_mean_max": 64.0,
            # thousandth (spec 4)
            "thousandth_min": 0.999,
            # accumulative error (spec 5); its "small" is 1
            "bound": self.bound,
            "eb_max": self.eb_max,
            "accumulative_small": 1.0,
            # benchmark (spec 6): ratio thresholds default to msprobe's ungraded level
            "atol_bm": self.atol_bm,
            "max_rel_err_ratio": 10.0,
            "mean_rel_err_ratio": 2.0,
            "rmse_ratio": 2.0,
            "small_value_err_ratio_ratio": 2.0,
            # ... whose floors are raised, where a ratio fails, to an output off by this many
            # ULPs of D at each element's tolerance scale (benchmark.py)
            "bm_noise_ulp": 2.0,
            # single-run rule (ours, see single_run.py)
            "sr_max_scaled_ulp": self.sr_max_scaled_ulp,
            "sr_mean_scaled_ulp": self.sr_mean_scaled_ulp,
            "sr_bias_ulp": self.sr_bias_ulp,
            "sr_bias_z": 5.0,
            "sr_scale_floor": 2.0**-6,
            "sr_max_top_ulp": self.sr_max_scaled_ulp,
            "sr_top_quantile": 0.9,
            # single-run allowances of the thousandth and absolute-threshold standards: ULPs of
            # D at max(|b|, scale) that a correct composite (gradient) kernel may carry
            "sr_thousandth_ulp": self.sr_thousandth_ulp,
            "sr_abs_ulp": 4.0,
            # bias tests (bias.py): correctly rounded elementwise APIs against b_D, and any
            # standard against a reference run on the same inputs, in ULPs of D
            "at_bias_ulp": self.at_bias_ulp,
            "ref_bias_ulp": 0.25,
            "ulp_bias_ulp": self.ulp_bias_ulp,
            # the lean a correct library of the API's class may have (accuracy.py): none
            # unless the accuracy model classes the API
            "lib_bias_ulp": 0.0,
        }


def _fp8(name: str, m: int, e_min: int) -> DtypeInfo | None:
    tdt = getattr(torch, name, None)
    if tdt is None:
        return None
    fi = torch.finfo(tdt)
    return DtypeInfo(
        name,
        m,
        e_min,
        float(fi.max),
        tdt,
        _Row(
            small=2.0**e_min,
            rtol=2.0**-m,
            small_atol=2.0 ** (e_min - m),
            ulp_threshold=1.0,
            ulp_floor=2.0**-m,
            ulp_prop_max=0.001,
            bound=2.0 ** -(m - 1),
            eb_max=2.0**-m,
            atol_bm=2.0 ** (e_min - m),
            sr_max_scaled_ulp=8.0,
            sr_mean_scaled_ulp=1.0,
        ).defaults(),
    )


# The spec gives float32's thresholds (small 2**-20, rtol 2**-20, small_atol 2**-30, T=32,
# floor 2**-14, bound 2**-11, eb_max 2**-14, atol_bm 2**-30) and none for float64: a float64
# output is judged by the same numbers (its bench is float64 too, so only rounding differs).
_WIDE = _Row(
    small=2.0**-20,
    rtol=2.0**-20,
    small_atol=2.0**-30,
    ulp_threshold=32.0,
    ulp_floor=2.0**-14,
    ulp_prop_max=0.05,
    bound=2.0**-11,
    eb_max=2.0**-14,
    atol_bm=2.0**-30,
    sr_max_scaled_ulp=4096.0,
    sr_mean_scaled_ulp=256.0,
    sr_bias_ulp=16.0,
    sr_thousandth_ulp=64.0,
    at_bias_ulp=1.0,
    ulp_bias_ulp=0.25,
)

DTYPES: dict[str, DtypeInfo] = {
    "float64": DtypeInfo("float64", 52, -1022, float(np.finfo(np.float64).max), torch.float64, _WIDE.defaults()),
    "float32": DtypeInfo("float32", 23, -126, float(np.finfo(np.float32).max), torch.float32, _WIDE.defaults()),
    "float16": DtypeInfo(
        "float16",
        10,
        -14,
        65504.0,
        torch.float16,
        _Row(
            small=2.0**-10,
            rtol=2.0**-10,
            small_atol=2.0**-16,
            ulp_threshold=1.0,
            ulp_floor=2.0**-11,
            ulp_prop_max=0.001,
            bound=2.0**-8,
            eb_max=2.0**-20,
            atol_bm=1e-16,
            sr_max_scaled_ulp=8.0,
            sr_mean_scaled_ulp=1.0,
        ).defaults(),
    ),
    "bfloat16": DtypeInfo(
        "bfloat16",
        7,
        -126,
        float(torch.finfo(torch.bfloat16).max),
        torch.bfloat16,
        _Row(
            small=2.0**-10,
            rtol=2.0**-8,
            small_atol=2.0**-16,
            ulp_threshold=1.0,
            ulp_floor=2.0**-8,
            ulp_prop_max=0.001,
            bound=2.0**-7,
            eb_max=2.0**-7,
            atol_bm=1e-16,
            sr_max_scaled_ulp=8.0,
            sr_mean_scaled_ulp=1.0,
        ).defaults(),
    ),
}
for _name, _m, _emin in (
    ("float8_e4m3fn", 3, -6),
    ("float8_e5m2", 2, -14),
    ("float8_e4m3fnuz", 3, -7),
    ("float8_e5m2fnuz", 2, -15),
):
    _info = _fp8(_name, _m, _emin)
    if _info is not None:
        DTYPES[_name] = _info

_ALIASES = {
    "float": "float32",
    "half": "float16",
    "double": "float64",
    "bf16": "bfloat16",
    "fp32": "float32",
    "fp16": "float16",
    "fp64": "float64",
}


def dtype_name(dtype: DtypeLike) -> str:
    """Canonical name of a torch dtype, numpy dtype or string ("torch.float32" -> "float32")."""
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.").lower()
        return _ALIASES.get(name, name)
    return np.dtype(dtype).name


def dtype_info(dtype: DtypeLike) -> DtypeInfo:
    """DtypeInfo of a floating dtype; complex dtypes map to their real part's."""
    name = dtype_name(dtype)
    name = {"complex64": "float32", "complex128": "float64", "complex32": "float16"}.get(name, name)
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"no precision constants for dtype {name!r}") from None


def is_float_name(name: str) -> bool:
    """True for floating and complex dtypes, False for bool and integers."""
    return name in DTYPES or name.startswith("complex")
