"""``InteractiveShell`` without a shell: ipywidgets' ``Output`` widget asks it for a display
formatter only when it captures output, which needs a shell; say so instead."""


class InteractiveShell:
    @classmethod
    def initialized(cls):
        return False

    @classmethod
    def instance(cls, *args, **kwargs):
        raise RuntimeError(
            "this page's Python has no IPython shell: an Output widget cannot capture display "
            "output here (the live calculators do not use one)"
        )
