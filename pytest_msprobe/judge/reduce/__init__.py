"""A failing call reduced to a smaller input that fails the same way, for a bug report
(`reduction`, the plugin's verdict its oracle), cutting only the dimensions the
`[reduce]` table lets it cut together (`cuts`).

May import: judge/verdict, judge/check.
"""
