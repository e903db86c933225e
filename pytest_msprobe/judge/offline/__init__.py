"""Offline references: a tensor dump's saved outputs ARE the device's result
(`dumped_run`), checked on any machine; the memory layouts a device may have run a call
in (`layouts`); and an input gradient autograd summed over several calls reading one
output (`summed_gradients`), with how far a correct device's sum may lie from the bench's
where the dump lacks a reader's share (`missing_shares`).

May import: judge/verdict.
"""
