"""ApproxLib: the ATP host library of NetApprox (docs/hostlib.md).

Sans-I/O cores: ``hostlib.sender.AtpSender``, ``hostlib.receiver.AtpReceiver`` (the reference) and their C
ports (``hostlib/native/``); ``hostlib.core`` picks which run. Blocking API:
``hostlib.api.send_job`` / ``receive_job`` / ``receive_jobs``. asyncio: ``hostlib.aio``. Many jobs on one socket:
``hostlib.exchange.AtpExchange``. CLI:
``python -m netapprox.hostlib send|recv`` (``atp-send``, ``atp-recv``). Configuration: ``hostlib.config``.
"""
