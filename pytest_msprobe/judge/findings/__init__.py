"""The checks beside the precision standards, reported with a call's verdict without
changing it: what a finding is and how it annotates a record (`finding`), the device's
bits over repeated runs (`repeat`, --msprobe-repeat), the re-check of a dumped inf/NaN
(`overflow`) and the device's float overflow mode read from its outputs (`overflow_modes`).

May import: judge/verdict, judge/offline.
"""
