"""access.log_text: a job's log is shown, never obeyed, by a terminal or the GitHub Actions runner.

The runner's rule (actions/runner, src/Runner.Common/ActionCommand.cs, TryParseV2): a line is a
command when, after TrimStart, it starts with `::`; `##[` is the older form.
"""

from __future__ import annotations

import pytest

from access.log_text import InertLines, inert


def test_colour_is_kept_as_ray_prints_it():
    line = "\x1b[36m(TaskRunner pid=4242)\x1b[0m step:1 - critic/score/mean:0.100\n"
    assert inert(line) == line


@pytest.mark.parametrize("hostile, shown", [
    ("\x1b]0;pwned\x07title\n", "title\n"),                        # window title (OSC 0)
    ("\x1b]52;c;Y3VybCBldmlsfHNo\x07clip\n", "clip\n"),            # clipboard write (OSC 52)
    ("\x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\\n", "link\n"),  # hyperlink
    ("done\x1b[1A\x1b[2Koverwritten\n", "doneoverwritten\n"),      # cursor up, erase line
    ("\x1b[6n\x1bPq#0;2;0;0;0\x1b\\ask\n", "ask\n"),               # cursor report query, DCS
    ("progress 10%\rprogress 99%\n", "progress 10%\nprogress 99%\n"),  # a carriage return hides nothing
    ("crlf\r\n", "crlf\n"),
    ("bell\x07nul\x00c1\x9b\n", "bellnulc1\n"),
    ("\u202eevil\u202c txt\n", "evil txt\n"),                      # bidirectional override
])
def test_escape_sequences_and_controls_are_removed(hostile: str, shown: str):
    assert inert(hostile) == shown


@pytest.mark.parametrize("line", ["::add-mask::x", "  ::set-env name=A::b", "\t::stop-commands::t",
                                  "\u2003::error::x", "##[set-output name=x]y"])
def test_a_workflow_command_line_is_shown_not_obeyed(line: str):
    out = inert(f"ok\n{line}\nok\n")
    assert out.splitlines()[1].lstrip().startswith("> ")
    assert not any(part.lstrip().startswith(("::", "##[")) for part in out.splitlines())


def test_a_command_split_across_stream_chunks_is_caught():
    lines = InertLines()
    out = lines.feed("step 1\n:") + lines.feed(":add-mask::secret\nstep") + lines.feed(" 2") + lines.flush()
    assert out == "step 1\n> ::add-mask::secret\nstep 2"
