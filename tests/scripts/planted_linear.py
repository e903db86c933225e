"""A planted fault, imported before a run (`-p planted_linear`, or first thing in a
script's interpreter): torch.nn.functional.linear returns float32 results 1 + 2**-5
too large; the float64 bench still gets the true function."""

import torch

_linear = torch.nn.functional.linear


def _faulty_linear(*args, **kwargs):
    out = _linear(*args, **kwargs)
    return out * (1 + 2**-5) if out.dtype == torch.float32 else out


torch.nn.functional.linear = _faulty_linear
