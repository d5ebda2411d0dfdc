"""The reference summarizer: a real service, simulated upstreams, and a chaos demo.

One command shows the library at work::

    python -m integrations.summarizer demo --quick

It starts simulated video platforms and a simulated two-tier model provider (served for
real by uvicorn on 127.0.0.1), starts the summarizer service, drives virtual users
through fault phases twice -- once with the policies off (**naive**) and once on
(**resilient**) -- and writes ``report.json`` and ``report.html``.

Modules:

* :mod:`.content` -- deterministic videos, subtitles and the extractive "model"
* :mod:`.platforms`, :mod:`.models` -- the simulated upstreams (raw ASGI, controllable)
* :mod:`.service`, :mod:`.pipeline`, :mod:`.inference`, :mod:`.policies`, :mod:`.cache`
  -- the service and its pipeline; :mod:`.policies` is the seam to the library
* :mod:`.load`, :mod:`.demo`, :mod:`.report` -- virtual users, phases, the report

No language model is involved: summaries are extractive and deterministic.
"""

from .config import ServiceConfig
from .content import DOMAINS

__all__ = ["DOMAINS", "ServiceConfig"]
