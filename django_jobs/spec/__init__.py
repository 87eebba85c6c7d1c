"""What a job is before it touches a database: the declarations a task, a queue or a schedule
makes, and their validation.

Below the models in the layers (pyproject.toml, ``[tool.importlinter]``): nothing here imports
``django_jobs.models``, the drivers or the engine, so the engine may use any of it, and all of it
is importable before Django's app registry is ready. One module per declaration:

* :mod:`.newjob`: ``NewJob``, one job to enqueue, as the backend, flows and schedules hand it to
  the engine;
* :mod:`.options`: the django-jobs task options (``@task(...)``/``.using(...)``), their
  validation and the ``(max_attempts, options)`` a job of a task stores;
* :mod:`.payload`: the JSON checks of arguments, return values and progress;
* :mod:`.tasks`: the tasks declared in this process, and a task path resolved to its ``Task``;
* :mod:`.queues`: queue names and ``DJANGO_JOBS["QUEUES"]`` declarations;
* :mod:`.backoff`, :mod:`.dedup`, :mod:`.retention`, :mod:`.schedules`, :mod:`.tracing`: the
  declarations of those features, and the pure computations on them (the next backoff delay,
  a finished job's purge time, a schedule's next ticks, a new job's trace id);
* :mod:`.settings`: the settings object's problems, declarations included (check E002).

The modules that act on these declarations through the engine (``queue("x").pause()``,
``schedule(...)``, ``trace(...)``) stay one layer up, where users import them from.
"""
