"""The ways a call can fail to be judged, each turned into a pytest outcome."""


class DumpError(Exception):
    """A dump.json that cannot be checked: one failing test for that file, the rest of
    the run goes on."""


class CallSkip(Exception):
    """The call cannot be replayed here (unknown API, no kernel, not replayable):
    the test skips with this reason."""


class CallError(Exception):
    """The call's data is broken or unsafe (missing/corrupt tensor, path outside the
    dump): the test fails with this reason, the run goes on."""


class MissingTensorFile(CallError):
    """A tensor file the record names is not in dump_tensor_data: what the caller then
    tells the user to do depends on whose file it is (an input, or offline the output)."""

    def __init__(self, where: str, data_name: str, folder: str) -> None:
        super().__init__(f"{where}: tensor file {data_name!r} is missing from {folder}")
        self.data_name = data_name
        self.folder = folder
