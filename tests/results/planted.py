"""A plugin with planted standards (`-p planted`): linear always errors, silu always
warns, with hostile reasons. A check that must fail, and text that must be tamed."""

from __future__ import annotations

from typing import Any

PLANTED_REASON = '=HYPERLINK("http://evil","x") 精度异常 ' + "long " * 20_000


class Planted:
    def pytest_msprobe_register_standards(self, registry: Any) -> None:
        def planted(status: str) -> Any:
            def judge(pair: Any, thresholds: Any, reference: Any = None) -> Any:
                return pair.verdict(
                    status, f"planted_{status}", {"cosine": -0.5}, {}, [PLANTED_REASON, "+second\nline"]
                )

            return judge

        for status, api in (("error", "linear"), ("warning", "silu")):
            registry.register_standard(f"planted_{status}", planted(status))
            registry.set_api_standard(api, f"planted_{status}")


pytest_msprobe_register_standards = Planted().pytest_msprobe_register_standards
