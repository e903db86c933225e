"""One call end to end: read its record, decode its inputs, replay it on every side
and judge it (`call`), what any outcome amounts to as a ResultRecord (`outcome`), the
element samples an HTML report plots (`samples`), and the check of a standards
registry's routes and thresholds before any call (`routing`).

May import: judge/verdict, judge/offline, judge/findings, judge/defects.
"""
