"""``display`` and ``clear_output`` without a shell: what IPython does outside one (print the
object's text form; ``clear_output`` has no output area to clear)."""


def display(*objs, **kwargs):
    for obj in objs:
        print(repr(obj))


def clear_output(wait=False):
    return None
