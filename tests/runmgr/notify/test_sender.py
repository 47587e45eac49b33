"""Notifications to a real webhook receiver on 127.0.0.1: retried with backoff until delivered,
given up on in words that hold no URL, never blocking the sender; where a URL is read from, and
that it is never recorded."""

from __future__ import annotations

import re

import pytest

from runmgr.config.compose import load_run_config, recorded_config
from runmgr.config.notify import MASK, NotifyConfig
from runmgr.errors import ConfigError
from runmgr.notify.sender import Notification, Notifier
from runmgr.notify.targets import NotifyConfigError, Webhook, resolve
from tests.webhook import receiver  # noqa: F401 (a fixture)

NOTE = Notification("needs_person", "run12", "12.04", "the restart budget is spent", 1.0)


def notifier(hooks, outcomes, **settings) -> Notifier:
    config = NotifyConfig(**{"backoff_s": 0.01, "attempts": 3, "timeout_s": 5.0, **settings})
    return Notifier(hooks, config, lambda note, hook, error, tries: outcomes.append((hook.label, error, tries)))


def test_a_notification_is_retried_until_the_webhook_takes_it_and_sent_once(receiver):
    receiver.failures_first = [500, 503]
    outcomes: list = []
    sender = notifier([Webhook(receiver.url, "webhook 1 (env:HOOK)")], outcomes)
    sender.send(NOTE)
    sender.close()
    (body,) = receiver.bodies
    assert body["kind"] == "needs_person" and body["run"] == "run12" and body["subrun"] == "12.04"
    assert body["text"] == "runmgr: run run12 (12.04) needs a person: the restart budget is spent"
    assert outcomes == [("webhook 1 (env:HOOK)", None, 3)]


def test_a_webhook_that_never_takes_it_is_given_up_on_in_words_without_its_url(receiver):
    receiver.failures_first = [500] * 10
    outcomes: list = []
    sender = notifier([Webhook(receiver.url, "webhook 1 ((set: not recorded))")], outcomes, attempts=2)
    sender.send(NOTE)
    sender.close()
    [(label, error, tries)] = outcomes
    assert tries == 2 and error.startswith("HTTP 500") and "secret-token" not in error and not receiver.bodies


def test_an_unreachable_webhook_is_a_failure_and_the_next_webhook_is_still_told(receiver):
    outcomes: list = []
    dead = Webhook("http://127.0.0.1:9/nothing-listens", "webhook 1 (env:DEAD)")
    sender = notifier([dead, Webhook(receiver.url, "webhook 2 (env:HOOK)")], outcomes, attempts=2)
    sender.send(NOTE)
    sender.close()
    assert outcomes[0][0] == "webhook 1 (env:DEAD)" and outcomes[0][1].startswith("no answer")
    assert outcomes[1] == ("webhook 2 (env:HOOK)", None, 1) and len(receiver.bodies) == 1


def test_slack_s_format_is_its_text_only(receiver):
    sender = notifier([Webhook(receiver.url, "webhook 1")], [], format="slack")
    sender.send(NOTE)
    sender.close()
    assert receiver.bodies == [{"text": NOTE.text()}]


def test_a_url_is_read_from_the_environment_or_a_file_and_a_missing_one_is_one_line(tmp_path):
    (tmp_path / "hook").write_text("https://hooks.example/T000/B000/xyz\n")
    config = NotifyConfig(webhook="env:RUNMGR_TEST_HOOK", webhooks=[f"file:{tmp_path / 'hook'}"])
    hooks = resolve(config, {"RUNMGR_TEST_HOOK": "http://127.0.0.1:1/a"})
    assert [h.url for h in hooks] == ["http://127.0.0.1:1/a", "https://hooks.example/T000/B000/xyz"]
    assert "xyz" not in repr(hooks) and hooks[0].label == "webhook 1 (env:RUNMGR_TEST_HOOK)"
    with pytest.raises(NotifyConfigError, match="the environment variable RUNMGR_TEST_HOOK is not set"):
        resolve(config, {})
    with pytest.raises(NotifyConfigError, match="cannot read"):
        resolve(NotifyConfig(webhook=f"file:{tmp_path / 'none'}"), {})


def test_a_url_written_in_the_config_is_used_and_never_in_the_recorded_config(tmp_path):
    url = "https://hooks.example/T000/B000/secret"
    config = load_run_config("demo", [f"run.dir={tmp_path}", f"notify.webhook={url}",
                                      "notify.webhooks=[env:SECOND_HOOK]"])
    assert resolve(config.notify, {"SECOND_HOOK": "http://127.0.0.1:1/b"})[0].url == url
    recorded = recorded_config(config)["notify"]
    assert recorded["webhook"] == MASK and recorded["webhooks"] == ["env:SECOND_HOOK"]
    assert "secret" not in str(recorded_config(config))


@pytest.mark.parametrize("override, words", [
    ("notify.webhook=ftp://x", re.escape("expected an http(s) URL, env:NAME")),
    ("notify.webhook=env:1BAD", "env: needs an environment variable's name"),
    ("notify.attempts=0", "notify.attempts must be at least 1"),
])
def test_a_webhook_setting_that_cannot_be_is_refused_with_one_line(tmp_path, override, words):
    with pytest.raises(ConfigError, match=words):
        load_run_config("demo", [f"run.dir={tmp_path}", override])
