"""A user's own PyTorch loop as an elastic PS job; the public face is :mod:`elasticps.torch`.

- :mod:`elasticps.loop.api`: the calls the loop makes, routed to a session;
- :mod:`elasticps.loop.local`: single-process and describe sessions;
- :mod:`elasticps.loop.worker_session`: the session inside a job's worker;
- :mod:`elasticps.loop.program`: :class:`LoopProgram`, what the runtime knows of a loop;
- :mod:`elasticps.loop.embedding` and :mod:`elasticps.loop.rows`: embedding tables the PS
  holds and no worker does (a worker pulls and pushes the rows its batch uses);
  :mod:`elasticps.loop.tables_on_ps`: a model's own ``nn.Embedding`` tables made so.
"""
