"""The ``tether`` command line: ``main`` holds the commands, ``app`` loads the user's harness,
``levers`` the commands that steer a task, ``render`` the output, ``integrity`` ``tether check``."""
