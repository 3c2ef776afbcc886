"""The one exception type for bad user input, shared by every package (this is the bottom layer).

The CLI turns it into a one-line message and exit code 2; the API raises it typed, so callers can
tell a user's mistake from a bug.
"""


class InputError(ValueError):
    """Bad input from a user: the message names the problem and the fix."""
