"""The engine: runs one task at a time under a lease and changes its state (R5, R11, R15).

``runner`` is the single place that changes a task's state and commits it; ``events``,
``levers``, ``recovery``, ``timers`` and ``degrade`` decide what an event, a person's lever,
a crash, a due time or a degraded mode means for the task, through the narrow interface in
``task``; ``worker`` claims tasks and keeps their leases (its host in ``host``); ``inbox``
stores events on their way in; ``loading`` reads the newest whole snapshot; ``preemption``
holds the work a P0 may cut; ``decisions`` says when a call in doubt needs a person.
"""
