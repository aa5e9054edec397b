"""The web edge: the HTTP API and webhooks (``server``), the operators' console (``console``,
``templates``), and what guards them (``security``, ``sessions``, ``webhooks``)."""
