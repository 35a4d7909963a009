"""``headway gateway``: the core's overload policies in front of OpenAI-compatible engines.

:mod:`~headway.gateway.config` reads ``gateway.yaml``; :mod:`~headway.gateway.control` is
the wall-clock driver of the core policies (admission, queues, routing, retries);
:mod:`~headway.gateway.server` is the aiohttp server (its generate path in
:mod:`~headway.gateway.generation`, the relay in :mod:`~headway.gateway.relay`, the admin
API in :mod:`~headway.gateway.admin`); ``docs/gateway.md`` has the user's view.
"""
