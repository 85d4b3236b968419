"""Secrets are write-only: job reads, run output, errors, alerts and node logs show "***" for them, the target still gets the real values, and a read-modify-write keeps them."""

from __future__ import annotations

import datetime as dt
import json
import secrets

import pytest
from hypothesis import given, strategies as st

from raftsched import limits
from raftsched.api.views import job_view, run_view
from raftsched.core import commands, jobspec
from raftsched.core.redact import (MASK, _cut_secret_chars, is_secret, redact_output,
                                   redact_target, redact_text, secret_values)
from raftsched.errors import CommandRefused, InvalidInput
from raftsched.executors.base import Outcome
from raftsched.runtime.dispatcher import masked_outcome
from raftsched.testing.http import wait_until
from raftsched.testing.sink import Sink

TOKEN = "tok-" + "a1b2c3d4e5"
HTTP_BODY = {
    "run_at": "2030-01-01T00:00:00Z",
    "target": {"type": "http", "url": "https://hooks.example/x",
               "headers": {"authorization": f"Bearer {TOKEN}", "Cookie": "theme=dark; sid=s3ss10n",
                           "X-Api-Key": "key-123456", "X-Plain": "visible"}},
    "secret_keys": ["x-api-key"],
}
COMMAND_BODY = {
    "run_at": "2030-01-01T00:00:00Z",
    "target": {"type": "command", "argv": ["/bin/true"],
               "env": {"DB_PASSWORD": "hunter22", "db_password": "lower-is-not-listed"}},
    "secret_keys": ["DB_PASSWORD"],
}


def spec_of(body: dict) -> dict:
    return jobspec.validate_create(body)["spec"]


def job_of(spec: dict) -> dict:
    return {"id": "job_" + "0" * 20, "spec": spec, "status": "active", "next_ms": None,
            "idempotency_key": None, "shard": 0, "version": 1, "last_run_id": None,
            "created_ms": 0, "updated_ms": 0}


# --- which values are secret --------------------------------------------------------------

def test_the_three_credential_headers_are_secret_in_any_case_and_listed_ones_too():
    for name in ("Authorization", "COOKIE", "proxy-authorization"):
        assert is_secret("http", name, [])
    assert not is_secret("http", "X-Api-Key", [])
    assert is_secret("http", "X-API-KEY", ["x-api-key"])   # headers: any case


def test_env_names_are_secret_only_as_listed_exactly():
    assert is_secret("command", "DB_PASSWORD", ["DB_PASSWORD"])
    assert not is_secret("command", "db_password", ["DB_PASSWORD"])
    assert not is_secret("command", "Authorization", [])   # an env variable, not a header


# --- job reads ----------------------------------------------------------------------------

def test_a_job_read_masks_secret_headers_and_keeps_the_stored_spec_whole():
    spec = spec_of(HTTP_BODY)
    view = job_view(job_of(spec))
    assert view["target"]["headers"] == {"authorization": MASK, "Cookie": MASK,
                                         "X-Api-Key": MASK, "X-Plain": "visible"}
    assert view["secret_keys"] == ["x-api-key"]
    assert spec["target"]["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in json.dumps(view)


def test_a_job_read_masks_listed_env_values_only():
    view = job_view(job_of(spec_of(COMMAND_BODY)))
    assert view["target"]["env"] == {"DB_PASSWORD": MASK, "db_password": "lower-is-not-listed"}


def test_a_job_stored_before_secret_keys_reads_with_the_credential_headers_masked():
    spec = spec_of(HTTP_BODY)
    del spec["secret_keys"]
    view = job_view(job_of(spec))
    assert view["secret_keys"] == []
    assert view["target"]["headers"]["authorization"] == MASK
    assert view["target"]["headers"]["X-Api-Key"] == "key-123456"


def test_a_publish_target_has_nothing_to_mask():
    target = {"type": "publish", "topic": "t", "message": {"Authorization": "x"}, "key": None}
    assert redact_target(target, ["Authorization"]) == target


# --- the texts masked in output and errors --------------------------------------------------

def test_secret_values_hold_each_value_its_credentials_and_cookie_values_longest_first():
    values = secret_values(spec_of(HTTP_BODY))
    assert {f"Bearer {TOKEN}", TOKEN, "theme=dark; sid=s3ss10n", "dark", "s3ss10n",
            "key-123456"} == set(values)
    assert [len(v) for v in values] == sorted((len(v) for v in values), reverse=True)
    assert "visible" not in values


def test_values_shorter_than_the_minimum_are_not_masked_in_text():
    body = dict(COMMAND_BODY, target=dict(COMMAND_BODY["target"], env={"PIN": "123"}),
                secret_keys=["PIN"])
    assert limits.secret_redact_chars_min > 3
    assert secret_values(spec_of(body)) == ()
    assert job_view(job_of(spec_of(body)))["target"]["env"] == {"PIN": MASK}


def test_json_escaped_forms_of_a_secret_are_masked_too():
    body = dict(COMMAND_BODY, target=dict(COMMAND_BODY["target"], env={"S": 'pa"ss\\wörd'}),
                secret_keys=["S"])
    values = secret_values(spec_of(body))
    echoed = json.dumps({"s": 'pa"ss\\wörd'}) + json.dumps({"s": 'pa"ss\\wörd'},
                                                            ensure_ascii=False)
    assert redact_text(echoed, values) == f'{{"s": "{MASK}"}}{{"s": "{MASK}"}}'


def test_redact_text_masks_every_occurrence_and_leaves_other_text_alone():
    values = ("hunter22",)
    assert redact_text("a hunter22 b hunter22", values) == f"a {MASK} b {MASK}"
    assert redact_text("nothing here", values) == "nothing here"
    assert redact_text("hunter22", ()) == "hunter22"


def test_a_secret_cut_by_a_bound_is_masked_where_the_text_was_cut():
    values = ("s3cr3t-t0ken-value",)
    notice = "\n[raftsched: 100 bytes of stdout dropped over output_bytes_max=65536]"
    assert redact_text("token=s3cr3t-t0", values) == f"token={MASK}"
    assert redact_text("token=s3cr3t-t0" + notice, values) == f"token={MASK}" + notice
    assert redact_text("HTTP 500: token=s3cr3t…", values) == f"HTTP 500: token={MASK}…"
    # A character cut in two decodes as U+FFFD; the start before it is masked.
    assert redact_text("token=s3cr3t\ufffd", values) == f"token={MASK}\ufffd"
    # Fewer than secret_redact_chars_min characters are not a secret's start.
    assert redact_text("token=s3c", values) == "token=s3c"


@given(head=st.text("ab", max_size=30), value=st.text("ab", min_size=1, max_size=20))
def test_the_start_of_a_cut_secret_is_found_as_trying_every_length_finds_it(head, value):
    """The linear search agrees with the obvious quadratic one."""
    longest = next((k for k in range(len(value) - 1, limits.secret_redact_chars_min - 1, -1)
                    if head.endswith(value[:k])), 0)
    assert _cut_secret_chars(head, value) == longest
    if value not in head:
        assert redact_text(head, (value,)) == (head[:len(head) - longest] + MASK if longest
                                               else head)


def test_redact_output_masks_the_texts_and_keeps_the_other_members():
    output = {"stdout": "pw=hunter22", "stderr": "hunter22", "http_body": "x hunter22",
              "published": "hunter22", "truncated": {"stdout": 0}, "holder": "hunter22-node"}
    masked = redact_output(output, ("hunter22",))
    assert masked == {"stdout": f"pw={MASK}", "stderr": MASK, "http_body": f"x {MASK}",
                      "published": MASK, "truncated": {"stdout": 0}, "holder": "hunter22-node"}


def test_an_outcome_is_masked_before_it_is_stored_or_replicated():
    job = job_of(spec_of(COMMAND_BODY))
    outcome = Outcome(ok=False, exit_code=3, error="exit code 3: hunter22",
                      output={"stdout": "pw=hunter22\n", "stderr": "hunter22\n"})
    masked = masked_outcome(job, outcome)
    assert masked.error == f"exit code 3: {MASK}"
    assert masked.output == {"stdout": f"pw={MASK}\n", "stderr": f"{MASK}\n"}
    assert masked_outcome(None, outcome) is outcome


def test_run_views_mask_errors_with_the_jobs_secrets():
    run = {"id": "run_" + "0" * 24, "job_id": "job_" + "0" * 20, "scheduled_ms": 0,
           "attempt": 1, "state": "failed", "trigger": "manual", "execution_id": "exe_1",
           "node": "n1", "created_ms": 0, "started_ms": 0, "finished_ms": 0,
           "http_status": None, "error": "exit code 1: hunter22",
           "attempts": [{"attempt": 1, "holder": "n1", "started_ms": 0, "finished_ms": 0,
                         "http_status": None, "exit_code": 1, "error": "hunter22"}]}
    view = run_view(run, ("hunter22",))
    assert view["error"] == f"exit code 1: {MASK}"
    assert view["attempts"][0]["error"] == MASK


# --- writes: secret_keys, and "***" keeps the stored value ---------------------------------

def test_secret_keys_are_validated_bounded_and_deduplicated():
    assert spec_of(dict(HTTP_BODY, secret_keys=None))["secret_keys"] == []
    assert spec_of(dict(HTTP_BODY, secret_keys=["A", "A", "b"]))["secret_keys"] == ["A", "b"]
    cases = [("nope", "secret_keys", None), ([""], "secret_keys[0]", None),
             (["A=B"], "secret_keys[0]", None), (["ok", "x\ny"], "secret_keys[1]", None),
             ([1], "secret_keys[0]", None),
             (["x" * (limits.secret_key_bytes_max + 1)], "secret_keys[0]", "secret_key_bytes_max"),
             (["k"] * (limits.secret_keys_max + 1), "secret_keys", "secret_keys_max")]
    for value, field, limit in cases:
        with pytest.raises(InvalidInput) as caught:
            spec_of(dict(HTTP_BODY, secret_keys=value))
        assert (caught.value.field, caught.value.limit) == (field, limit), value
    assert spec_of(dict(HTTP_BODY, secret_keys=["é" * (limits.secret_key_bytes_max // 2)]))


def test_the_replicated_spec_schema_takes_secret_keys_and_refuses_a_bad_one():
    spec = spec_of(HTTP_BODY)

    def command(spec: dict) -> dict:
        return commands.create_job(job_id="job_" + "0" * 20, tenant="default", spec=spec,
                                   idempotency_key=None, shard=0, next_ms=None, at_ms=0)
    commands.decode(commands.encode(command(spec)))
    with pytest.raises(CommandRefused):
        commands.decode(commands.encode(command(dict(spec, secret_keys="x-api-key"))))
    with pytest.raises(CommandRefused):
        commands.decode(commands.encode(command(
            dict(spec, secret_keys=["k"] * (limits.secret_keys_max + 1)))))


def test_a_patch_of_the_read_target_keeps_every_stored_secret():
    current = spec_of(HTTP_BODY)
    read = job_view(job_of(current))
    patched = jobspec.validate_patch({"target": read["target"], "name": "renamed"}, current)
    assert patched["target"]["headers"] == current["target"]["headers"]
    env_current = spec_of(COMMAND_BODY)
    read = job_view(job_of(env_current))
    patched = jobspec.validate_patch({"target": read["target"]}, env_current)
    assert patched["target"]["env"] == env_current["target"]["env"]


def test_mask_matches_the_stored_header_in_any_case_and_a_new_value_replaces_it():
    current = spec_of(HTTP_BODY)
    target = dict(HTTP_BODY["target"], headers={"AUTHORIZATION": MASK, "x-api-key": "new-key"})
    patched = jobspec.validate_patch({"target": target}, current)
    assert patched["target"]["headers"] == {"AUTHORIZATION": f"Bearer {TOKEN}",
                                            "x-api-key": "new-key"}


def test_mask_for_a_name_unlisted_in_the_same_patch_is_refused_naming_it():
    current = spec_of(HTTP_BODY)
    read = job_view(job_of(current))
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_patch({"target": read["target"], "secret_keys": []}, current)
    assert caught.value.field == "target.headers.X-Api-Key"
    assert "key-123456" not in caught.value.detail
    env_current = spec_of(COMMAND_BODY)
    read = job_view(job_of(env_current))
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_patch({"target": read["target"], "secret_keys": []}, env_current)
    assert caught.value.field == "target.env.DB_PASSWORD"
    url_current = spec_of(URL_BODY)
    read = job_view(job_of(url_current))
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_patch({"target": read["target"], "secret_keys": []}, url_current)
    assert caught.value.field == "target.url"


def test_unlisting_a_name_with_a_new_value_or_without_the_name_is_allowed():
    current = spec_of(HTTP_BODY)
    read = job_view(job_of(current))
    fresh = dict(read["target"], headers=dict(read["target"]["headers"], **{"X-Api-Key": "v2"}))
    patched = jobspec.validate_patch({"target": fresh, "secret_keys": []}, current)
    assert patched["target"]["headers"]["X-Api-Key"] == "v2"
    assert patched["target"]["headers"]["authorization"] == f"Bearer {TOKEN}"
    gone = dict(read["target"], headers={k: v for k, v in read["target"]["headers"].items()
                                         if k != "X-Api-Key"})
    patched = jobspec.validate_patch({"target": gone, "secret_keys": []}, current)
    assert "X-Api-Key" not in patched["target"]["headers"]


def test_mask_for_a_secret_with_no_stored_value_is_refused_naming_it():
    current = spec_of(HTTP_BODY)
    target = dict(HTTP_BODY["target"], headers={"X-New-Token": MASK})
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_patch({"target": target, "secret_keys": ["X-New-Token"]}, current)
    assert caught.value.field == "target.headers.X-New-Token"
    # A create has no stored value at all.
    with pytest.raises(InvalidInput) as caught:
        spec_of(dict(COMMAND_BODY, target=dict(COMMAND_BODY["target"],
                                               env={"DB_PASSWORD": MASK})))
    assert caught.value.field == "target.env.DB_PASSWORD"
    # Changing the target's type leaves nothing stored under the name.
    with pytest.raises(InvalidInput):
        jobspec.validate_patch({"target": dict(COMMAND_BODY["target"], env={"Cookie": MASK}),
                                "secret_keys": ["Cookie"]}, current)


def test_mask_for_a_name_that_is_not_secret_is_an_ordinary_value():
    current = spec_of(HTTP_BODY)
    target = dict(HTTP_BODY["target"], headers={"X-Plain": MASK})
    assert jobspec.validate_patch({"target": target}, current)["target"]["headers"] == \
        {"X-Plain": MASK}


URL_BODY = {
    "run_at": "2030-01-01T00:00:00Z",
    "target": {"type": "http",
               "url": "https://svc:pa%24%24word-9@hooks.example/x?Token=t0k-abcdef&page=2#top"},
    "secret_keys": ["token"],
}


def test_a_urls_password_and_listed_query_values_are_masked_in_reads_and_output():
    spec = spec_of(URL_BODY)
    view = job_view(job_of(spec))
    assert view["target"]["url"] == f"https://svc:{MASK}@hooks.example/x?Token={MASK}&page=2#top"
    assert spec["target"]["url"] == URL_BODY["target"]["url"]
    values = secret_values(spec)
    assert {"pa%24%24word-9", "pa$$word-9", "t0k-abcdef"} <= set(values)
    error = "POST https://svc:pa%24%24word-9@hooks.example/x?Token=t0k-abcdef: login pa$$word-9"
    assert redact_text(error, values) == \
        f"POST https://svc:{MASK}@hooks.example/x?Token={MASK}: login {MASK}"


@given(st.from_regex(r"https?://[a-z0-9.]{1,20}(:[0-9]{1,5})?(/[a-zA-Z0-9_.~-]{0,10}){0,3}"
                     r"(\?[a-z]{1,5}=[a-zA-Z0-9%+-]{0,8}(&[a-z]{1,5}=[a-zA-Z0-9%+-]{0,8}){0,3})?"
                     r"(#[a-z]{0,5})?", fullmatch=True))
def test_a_url_without_a_password_or_listed_parameter_reads_as_written(url):
    assert redact_target({"type": "http", "url": url}, ["absent"])["url"] == url


def test_a_patch_of_the_read_url_keeps_its_stored_secrets_and_a_new_value_replaces_them():
    current = spec_of(URL_BODY)
    read = job_view(job_of(current))
    patched = jobspec.validate_patch({"target": read["target"]}, current)
    assert patched["target"]["url"] == URL_BODY["target"]["url"]
    moved = read["target"]["url"].replace("/x?", "/y?").replace("page=2", "page=3")
    patched = jobspec.validate_patch({"target": dict(read["target"], url=moved)}, current)
    assert patched["target"]["url"] == \
        "https://svc:pa%24%24word-9@hooks.example/y?Token=t0k-abcdef&page=3#top"
    fresh = read["target"]["url"].replace(f"Token={MASK}", "Token=new-token-1")
    patched = jobspec.validate_patch({"target": dict(read["target"], url=fresh)}, current)
    assert "Token=new-token-1" in patched["target"]["url"]
    assert "pa%24%24word-9" in patched["target"]["url"]


def test_mask_in_a_url_with_no_stored_secret_is_refused_naming_the_url():
    for url in (f"https://svc:{MASK}@hooks.example/x", f"https://hooks.example/x?token={MASK}"):
        with pytest.raises(InvalidInput) as caught:
            spec_of(dict(URL_BODY, target={"type": "http", "url": url}))
        assert caught.value.field == "target.url"


def test_a_patch_of_secret_keys_alone_changes_what_reads_mask():
    current = spec_of(HTTP_BODY)
    patched = jobspec.validate_patch({"secret_keys": ["X-Plain", "x-api-key"]}, current)
    assert patched["target"] == current["target"]
    headers = job_view(job_of(patched))["target"]["headers"]
    assert headers["X-Plain"] == MASK
    assert headers["X-Api-Key"] == MASK


@pytest.mark.parametrize("body, keys", [(HTTP_BODY, ["X-Plain"]), (COMMAND_BODY, []),
                                        (URL_BODY, [])])
def test_a_patch_of_secret_keys_alone_that_unlists_a_stored_secret_is_refused(body, keys):
    current = spec_of(body)
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_patch({"secret_keys": keys}, current)
    assert caught.value.field == "secret_keys"
    # Un-listing a name the job holds no value of shows nothing: allowed.
    listed = jobspec.validate_patch({"secret_keys": [*current["secret_keys"], "absent"]},
                                    current)
    assert jobspec.validate_patch({"secret_keys": current["secret_keys"]},
                                  listed)["secret_keys"] == current["secret_keys"]


def test_a_dag_task_cannot_unlist_a_stored_secret():
    task = {"id": "a", "target": HTTP_BODY["target"]}
    current = spec_of({"run_at": HTTP_BODY["run_at"], "dag": {"tasks": [task]},
                       "secret_keys": ["x-api-key"]})
    read = {"tasks": [{"id": "a", "target": t["target"]}
                      for t in job_view(job_of(current))["dag"]["tasks"]]}
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_patch({"dag": read, "secret_keys": []}, current)
    assert caught.value.field == "dag.tasks[0].target.headers.X-Api-Key"
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_patch({"secret_keys": []}, current)
    assert caught.value.field == "secret_keys"


# --- a kept secret goes where it went -----------------------------------------------------

@pytest.mark.parametrize("url", [
    "https://elsewhere.example/x",          # another host
    "http://hooks.example/x",               # another scheme
    "https://hooks.example:8443/x",         # another port
    "https://hooks.example.attacker.example/x",
])
def test_mask_for_a_header_sent_to_another_origin_is_refused_naming_it(url):
    current = spec_of(HTTP_BODY)
    read = job_view(job_of(current))
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_patch({"target": dict(read["target"], url=url)}, current)
    assert caught.value.field == "target.headers.authorization"
    assert "hooks.example" in caught.value.detail


def test_mask_for_a_header_on_the_same_origin_spelled_otherwise_is_kept():
    current = spec_of(HTTP_BODY)
    read = job_view(job_of(current))
    for url in ("https://HOOKS.example:443/other?q=1", "https://hooks.example/y"):
        patched = jobspec.validate_patch({"target": dict(read["target"], url=url)}, current)
        assert patched["target"]["headers"] == current["target"]["headers"]
    # A new value may go anywhere: it is the caller's, not the stored one.
    fresh = {"authorization": "Bearer new", "Cookie": "c=new-cookie", "X-Api-Key": "k2"}
    patched = jobspec.validate_patch({"target": dict(read["target"], headers=fresh,
                                                     url="https://elsewhere.example/")},
                                     current)
    assert patched["target"]["headers"] == fresh


@pytest.mark.parametrize("url", [
    f"https://svc:{MASK}@elsewhere.example/x",          # the password, to another host
    f"https://hooks.example:444/x?Token={MASK}",        # a listed parameter, another port
    f"http://svc:{MASK}@hooks.example/x?Token={MASK}",  # both, another scheme
])
def test_mask_in_a_url_moved_to_another_origin_is_refused_naming_the_url(url):
    current = spec_of(URL_BODY)
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_patch({"target": {"type": "http", "url": url}}, current)
    assert caught.value.field == "target.url"
    assert "pa%24%24word-9" not in caught.value.detail


def test_mask_with_a_url_that_is_not_one_is_refused_naming_the_url():
    current = spec_of(HTTP_BODY)
    read = job_view(job_of(current))
    for url in ("ftp://hooks.example/x", "https://", "https://hooks.example:99999/x"):
        with pytest.raises(InvalidInput) as caught:
            jobspec.validate_patch({"target": dict(read["target"], url=url)}, current)
        assert caught.value.field == "target.url", url


def test_a_refused_url_holding_a_kept_secret_is_not_echoed_in_the_error():
    current = spec_of(URL_BODY)
    for url in (f"ftp://svc:{MASK}@hooks.example/x?Token={MASK}",
                f"https://svc:{MASK}@/x?Token={MASK}"):
        with pytest.raises(InvalidInput) as caught:
            jobspec.validate_patch({"target": {"type": "http", "url": url}}, current)
        assert caught.value.field == "target.url"
        for secret in ("pa%24%24word-9", "pa$$word-9", "t0k-abcdef"):
            assert secret not in caught.value.detail, (url, caught.value.detail)


def test_mask_for_an_env_value_sent_to_another_queue_is_refused_naming_it():
    current = spec_of(COMMAND_BODY)
    read = job_view(job_of(current))
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_patch({"target": dict(read["target"], queue="gpu")}, current)
    assert caught.value.field == "target.env.DB_PASSWORD"
    for same in ({"argv": ["/bin/date"]}, {"queue": None}, {"queue": "default"}):
        kept = jobspec.validate_patch({"target": dict(read["target"], **same)}, current)
        assert kept["target"]["env"] == current["target"]["env"], same


def test_mask_for_a_dag_task_moved_to_another_origin_is_refused_naming_the_task():
    task = {"id": "a", "target": HTTP_BODY["target"]}
    current = spec_of({"run_at": HTTP_BODY["run_at"], "dag": {"tasks": [task]},
                       "secret_keys": ["x-api-key"]})
    read = job_view(job_of(current))["dag"]["tasks"][0]["target"]
    moved = {"tasks": [{"id": "a", "target": dict(read, url="https://elsewhere.example/")}]}
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_patch({"dag": moved}, current)
    assert caught.value.field == "dag.tasks[0].target.headers.authorization"


# --- on a cluster -----------------------------------------------------------------------------

def later() -> str:
    """A one-off's time far enough ahead that only manual triggers run it."""
    at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
    return at.isoformat(timespec="seconds").replace("+00:00", "Z")


def trigger_until_failed(cluster, job_id: str) -> dict:
    answer = cluster.api("n1", "POST", f"/v1/jobs/{job_id}:trigger")
    assert answer.status == 201, answer
    run_id = answer.body["run_id"]

    def failed() -> dict | None:
        run = cluster.api("n2", "GET", f"/v1/runs/{run_id}?consistent=true").body
        return run if run["state"] == "failed" else None
    return wait_until(failed, 30, f"run {run_id} to fail")


def alert_for(alerts: Sink, run_id: str) -> bytes:
    def found() -> bytes | None:
        # Calls to a job's target name the job; alerts do not.
        return next((c.body for c in alerts.snapshot()
                     if not c.job_id and json.loads(c.body).get("run_id") == run_id), None)
    return wait_until(found, 30, f"the alert of {run_id}")


def no_secret_in(text: str, values: list[str]) -> bool:
    return not any(v in text for v in values)


def files_holding(cluster, needle: bytes) -> list[str]:
    """The files under the nodes' data folders (state, Raft journal, output
    store) that hold `needle`."""
    return [str(path) for nid in cluster.ids for path in (cluster.base / nid).rglob("*")
            if path.is_file() and needle in path.read_bytes()]


def node_logs(cluster) -> str:
    return "".join(cluster.logs(nid, tail_chars=10 ** 8) for nid in cluster.ids)


@pytest.mark.integration
def test_http_secrets_are_write_only_on_a_cluster(shared_cluster):
    token, cookie, key = (secrets.token_hex(12) for _ in range(3))
    values = [token, cookie, key]
    # The target answers 500 with the headers it got: its body and the error
    # that quotes it hold every secret unless they are masked.
    with Sink(status_for=lambda call: 500 if call.job_id else 200,
              body_for=lambda call: json.dumps(call.headers).encode()) as sink:
        body = {"name": "secret-http", "run_at": later(), "retry": {"max_attempts": 1},
                "target": {"type": "http", "url": sink.url,
                           "headers": {"Authorization": f"Bearer {token}",
                                       "Cookie": f"sid={cookie}", "X-Api-Key": key}},
                "secret_keys": ["x-api-key"],
                "alert": {"webhook_url": sink.url.replace("/hook", "/alert")}}
        created = shared_cluster.api("n1", "POST", "/v1/jobs", body)
        assert created.status == 201, created
        job_id = created.body["job_id"]
        assert no_secret_in(json.dumps(created.body), values)
        read = shared_cluster.api("n2", "GET", f"/v1/jobs/{job_id}?consistent=true").body
        assert read["target"]["headers"] == {"Authorization": MASK, "Cookie": MASK,
                                             "X-Api-Key": MASK}
        listed = shared_cluster.api("n3", "GET", "/v1/jobs?consistent=true&limit=500").body
        assert [j["target"] for j in listed["jobs"] if j["job_id"] == job_id] == [read["target"]]

        run = trigger_until_failed(shared_cluster, job_id)
        sent = [c for c in sink.snapshot() if c.job_id == job_id]
        assert sent[-1].headers["Authorization"] == f"Bearer {token}"
        assert sent[-1].headers["Cookie"] == f"sid={cookie}"
        assert sent[-1].headers["X-Api-Key"] == key
        logs = shared_cluster.api("n3", "GET", f"/v1/runs/{run['run_id']}/logs").body
        assert MASK in logs["attempts"][0]["http_body"]
        assert no_secret_in(json.dumps(logs), values)
        assert run["error"].startswith("HTTP 500") and no_secret_in(json.dumps(run), values)
        alert = alert_for(sink, run["run_id"])
        assert b"HTTP 500" in alert and no_secret_in(alert.decode(), values)
        echoed = f'"Authorization": "Bearer {token}"'.encode()   # as the target echoed it
        assert not files_holding(shared_cluster, echoed)

        # Read, change, write back: the masks keep the stored values.
        patch = {"name": "secret-http-renamed", "target": read["target"],
                 "secret_keys": read["secret_keys"]}
        patched = shared_cluster.api("n2", "PATCH", f"/v1/jobs/{job_id}", patch)
        assert patched.status == 200, patched
        assert patched.body["target"]["headers"]["Authorization"] == MASK
        trigger_until_failed(shared_cluster, job_id)
        again = [c for c in sink.snapshot() if c.job_id == job_id][-1]
        assert (again.headers["Authorization"], again.headers["X-Api-Key"]) == \
            (f"Bearer {token}", key)

        new = dict(read["target"], headers={"X-New-Token": MASK})
        refused = shared_cluster.api("n1", "PATCH", f"/v1/jobs/{job_id}",
                                     {"target": new, "secret_keys": ["X-New-Token"]})
        assert refused.status == 400, refused
        assert refused.body["field"] == "target.headers.X-New-Token"
    assert no_secret_in(node_logs(shared_cluster), values)


@pytest.mark.integration
def test_command_env_secrets_are_write_only_on_a_cluster(shared_cluster, tmp_path):
    password = secrets.token_hex(12)
    seen = tmp_path / "seen"
    with Sink() as alerts:
        body = {"name": "secret-command", "run_at": later(), "retry": {"max_attempts": 1},
                "target": {"type": "command", "shell": True,
                           "env": {"DB_PASSWORD": password, "PLAIN": "shown"},
                           "argv": [f'printf %s "$DB_PASSWORD" > {seen}; '
                                    'echo "pw=$DB_PASSWORD plain=$PLAIN"; '
                                    'echo "failed with $DB_PASSWORD" >&2; exit 3']},
                "secret_keys": ["DB_PASSWORD"], "alert": {"webhook_url": alerts.url}}
        created = shared_cluster.api("n1", "POST", "/v1/jobs", body)
        assert created.status == 201, created
        job_id = created.body["job_id"]
        read = shared_cluster.api("n2", "GET", f"/v1/jobs/{job_id}?consistent=true").body
        assert read["target"]["env"] == {"DB_PASSWORD": MASK, "PLAIN": "shown"}

        run = trigger_until_failed(shared_cluster, job_id)
        assert seen.read_text() == password   # the command got the real value
        logs = shared_cluster.api("n3", "GET", f"/v1/runs/{run['run_id']}/logs").body
        attempt = logs["attempts"][0]
        assert attempt["stdout"] == f"pw={MASK} plain=shown\n"
        assert attempt["stderr"] == f"failed with {MASK}\n"
        assert run["error"] == f"exit code 3: failed with {MASK}"
        alert = alert_for(alerts, run["run_id"])
        assert password not in alert.decode()
        assert json.loads(alert)["last_error"] == run["error"]
        # Masked before it was stored or replicated: the output and the error
        # as the command wrote them are in no node's files (the spec, with the
        # password, is: the executor needs it).
        for echoed in (f"pw={password}", f"failed with {password}"):
            assert not files_holding(shared_cluster, echoed.encode()), echoed

        seen.unlink()
        patched = shared_cluster.api("n3", "PATCH", f"/v1/jobs/{job_id}",
                                     {"target": read["target"]})
        assert patched.status == 200, patched
        trigger_until_failed(shared_cluster, job_id)
        assert seen.read_text() == password
    assert password not in node_logs(shared_cluster)
