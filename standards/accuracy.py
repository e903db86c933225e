"""The accuracy model: how far a correct library's results may systematically lean.

Two correct libraries never round alike: CANN's kernels on an NPU, cuDNN and CUDA's
math library on a GPU, ATen's (SLEEF) on the CPU, XLA's. The bias sign tests
(bias.py) are certain of a lean of a fraction of an ULP, so in float32 and float64 a
limit measured between two kernels of one library would call another library's
correct kernel an error (XLA's gelu leans -0.5 ULP, its tanh -1 ULP, a hardswish that
multiplies by a rounded 1/6 +0.33 ULP) -- and a limit fitted between measured kernels
and a planted fault is no limit at all. The limit comes from what the libraries
document instead, as data (tables/accuracy_model.csv, each row naming its source):

  max_ulp     the largest distance, in ULPs of D, of a correct result from the
              correctly rounded one (CUDA's definition in its table of maximum ULP
              errors; 0 for IEEE 754's correctly rounded operations). Since d - b_D is
              what the bias tests average, it bounds any systematic lean directly.
  shared_ulp  the relative rounding, in ULPs of the quantity, of one number shared by
              the whole tensor or a group of it (a scalar operand or constant rounded
              to D once, a normaliser): it shifts every element it scales the same way,
              by up to twice as many ULPs of D (the element may sit at the top of its
              binade while the shared number sits at the bottom of its own).

so a class allows a lean of `max_ulp + 2 * shared_ulp` ULPs (`lib_bias_ulp`), and
tables/accuracy_classes.csv puts each API in a class. `reduction` marks the classes
whose result also carries a long reduction's rounding (matrix products, convolutions,
normalisations, attention): no library documents that part in ULPs, so there the
reference run in D, which has it too, excuses it (bias.py), and the single-run rule
keeps its own limit; elsewhere the class's lean is also the single-run limit. A backward formula is made of
the same library functions as the forward (tanh' = 1 - tanh**2, gelu' = Phi + x phi),
so both directions take the API's class.

16-bit outputs: ATen (opmath), CUDA and CANN compute in float32 and round to nearest
once, so a correct result leans by 2**-13 ULP of D at most: the `*` rows allow 0 and
the sign tests keep the dtype's own strict limits (any other rounding is a defect).

An API in no class keeps the standards' own limits unchanged. Users may override
`lib_bias_ulp` per API and dtype like any threshold (registry.py).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from typing import IO

from .signs import LIB_BIAS_KEY

__all__ = ["AccuracyClass", "LIB_BIAS_KEY", "SINGLE_RUN_KEY", "allowances", "class_for", "load_model"]

#: the single-run rule's limit of a lean (single_run.py), bounded by the class's where
#: its row is complete
SINGLE_RUN_KEY = "sr_bias_ulp"
#: the model's row for every class of a dtype (16-bit: rounded once from float32)
EVERY_CLASS = "*"


@dataclass(frozen=True)
class AccuracyClass:
    """One row of tables/accuracy_model.csv: what correct libraries document."""

    name: str
    dtype: str
    max_ulp: float
    shared_ulp: float
    reduction: bool  # a reduction's own rounding lies outside the row (module docstring)
    source: str

    @property
    def bias_ulp(self) -> float:
        """The largest systematic lean (ULPs of D) a correct library of this class may have."""
        return self.max_ulp + 2.0 * self.shared_ulp


def _rows(handle: IO[str]) -> list[dict[str, str]]:
    return [{key: (value or "").strip() for key, value in row.items()} for row in csv.DictReader(handle)]


def _table(name: str) -> list[dict[str, str]]:
    with (resources.files(__package__) / "tables" / name).open(encoding="utf-8") as handle:
        return _rows(handle)


def load_model() -> tuple[dict[tuple[str, str], AccuracyClass], dict[str, str]]:
    """The shipped model: {(class, dtype): row} and {api: class}."""
    model = {
        (row["class"], row["dtype"]): AccuracyClass(
            row["class"],
            row["dtype"],
            float(row["max_ulp"]),
            float(row["shared_ulp"]),
            row["reduction"] == "1",
            row["source"],
        )
        for row in _table("accuracy_model.csv")
    }
    classes = {row["api"]: row["class"] for row in _table("accuracy_classes.csv")}
    unknown = sorted({name for name in classes.values() if not any(key[0] == name for key in model)})
    if unknown:
        raise ValueError(f"tables/accuracy_classes.csv names classes the model has no row of: {unknown}")
    return model, classes


def class_for(
    api: str, dtype: str, model: dict[tuple[str, str], AccuracyClass], classes: dict[str, str]
) -> AccuracyClass | None:
    """The model's row for an API's outputs in `dtype`: its class's, or the dtype's row
    for every class (16-bit); None where the API is in no class."""
    every = model.get((EVERY_CLASS, dtype))
    if every is not None:
        return every
    name = classes.get(api)
    return None if name is None else model.get((name, dtype))


def allowances() -> list[tuple[str, str, str, float]]:
    """The registry's threshold rows (api, dtype, threshold, value) for every classified
    API in every dtype the model has a row for, in-place forms (`tanh_`) included:
    `lib_bias_ulp`, and where the row bounds the lean on its own (no reduction) and
    allows one, the single-run limit `sr_bias_ulp` too, since a single run has no
    reference run to excuse a lean beyond what the class allows."""
    model, classes = load_model()
    dtypes = sorted({dtype for _, dtype in model})
    rows: list[tuple[str, str, str, float]] = []
    for api in sorted(classes):
        forms = (api,) if api.startswith("__") else (api, f"{api}_")
        for dtype in dtypes:
            row = class_for(api, dtype, model, classes)
            if row is None:
                continue
            rows.extend((form, dtype, LIB_BIAS_KEY, row.bias_ulp) for form in forms)
            if row.bias_ulp > 0 and not row.reduction:
                rows.extend((form, dtype, SINGLE_RUN_KEY, row.bias_ulp) for form in forms)
    return rows
