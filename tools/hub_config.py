"""Write a copy of ``_config.yml`` with a JupyterHub launch button (``make book JUPYTERHUB_URL=...``).

The repository cannot know an institution's hub, so ``_config.yml`` enables only the Binder
and Colab buttons. Given a hub URL this prints the same configuration with
``launch_buttons.jupyterhub_url`` set; the Makefile passes it to ``jupyter-book build --config``.
"""

from __future__ import annotations

import sys
from urllib.parse import urlparse

import yaml


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: hub_config.py HUB_URL CONFIG_OUT", file=sys.stderr)
        return 2
    url, out = argv
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        print(
            f"JUPYTERHUB_URL={url!r} is not an http(s) URL such as https://hub.example.edu",
            file=sys.stderr,
        )
        return 2
    with open("_config.yml") as f:
        config = yaml.safe_load(f)
    config.setdefault("launch_buttons", {})["jupyterhub_url"] = url.rstrip("/")
    with open(out, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False, allow_unicode=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
