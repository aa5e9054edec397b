"""The engine: runs one task at a time under a lease and changes its state (R5, R11, R15).

``runner`` is the single place that changes a task's state and commits it; ``events``,
``levers``, ``recovery``, ``calls``, ``timers`` and ``degrade`` decide what an event, a
person's lever, a crash, a tool call, a due time or a degraded mode means for the task,
through the narrow interface in ``task``; ``calls`` holds a tool call's whole life, from
its key to its result (in doubt, reconcile, a person's decision); ``budget`` is the bounded
recovery both spend from; ``worker`` claims tasks and keeps their leases (its host in
``host``); ``inbox`` stores events on their way in; ``loading`` reads the newest whole
snapshot; ``preemption`` holds the work a P0 may cut.
"""
