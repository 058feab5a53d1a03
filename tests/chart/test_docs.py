"""The chart's documentation against the chart, the Makefile and the repository README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.chart.support import CHART, RELEASE, ROOT, Helm, Manifests

README = CHART / "README.md"
CONTROLLER = f"{RELEASE}-controller"
# A document cited in a template or values comment: `README.md: "Section"`, or
# `DESIGN.md section 5`.
_CITATION = re.compile(r'([\w./-]+\.md)(?::\s*"([^"]+)"|\s+section\s+([\w.]+))?')


def _section(text: str, heading: str) -> str:
    match = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#+ |\Z)", text, re.M | re.S)
    assert match, f"no section {heading!r}"
    return match.group(1)


def _headings(path: Path) -> set[str]:
    return set(re.findall(r"^#+ (.+)$", path.read_text(), flags=re.MULTILINE))


def test_template_and_values_comments_cite_documents_that_exist():
    """Every document a template or values.yaml comment cites is in the repository (next to
    the chart, or at the top), and every section it names is a heading there."""
    sources = [*sorted((CHART / "templates").iterdir()), CHART / "values.yaml"]
    cited = 0
    for source in sources:
        for name, heading, number in _CITATION.findall(source.read_text()):
            found = [p for p in (CHART / name, ROOT / name) if p.is_file()]
            assert found, f"{source.name} cites {name}, which the repository does not have"
            assert not number, f"{source.name} cites {name} by section number; name it"
            if heading:
                assert heading in _headings(found[0]), f"{source.name}: {name} has no {heading!r}"
            cited += 1
    assert cited  # the check ran over something


def test_values_table_says_what_rbac_grants(default: Manifests):
    """The README's rbac.create row names every resource and verb the agent's rendered
    roles grant (Events and the shutdown reads included), so it cannot say pods-only
    while Events are granted."""
    row = next(
        line for line in README.read_text().splitlines() if line.startswith("| `rbac.create`")
    )
    rules = [
        rule
        for role in default.of_kind("ClusterRole") + default.of_kind("Role")
        for rule in role["rules"]
    ]
    for rule in rules:
        for resource in rule["resources"]:
            assert f"`{resource}`" in row or resource in row, f"row omits {resource}: {row}"
        for verb in rule["verbs"]:
            assert f"`{verb}`" in row, f"row omits {verb}: {row}"
    assert " only" not in row or len(rules) == 1


def _make_targets() -> dict[str, tuple[list[str], list[str]]]:
    """Makefile target -> (prerequisites, recipe lines)."""
    targets: dict[str, tuple[list[str], list[str]]] = {}
    current: list[str] | None = None
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("\t") and current is not None:
            current.append(line.strip())
            continue
        match = re.match(r"^([\w.$()/-]+):(?!=)\s*(.*)$", line)
        if match and not match.group(1).startswith("."):
            recipe: list[str] = []
            targets[match.group(1)] = (match.group(2).split(), recipe)
            current = recipe
        else:
            current = None
    return targets


def _runs(target: str, targets: dict[str, tuple[list[str], list[str]]]) -> list[str]:
    """Every recipe line ``make target`` runs, prerequisites first."""
    prerequisites, recipe = targets.get(target, ([], []))
    return [line for p in prerequisites for line in _runs(p, targets)] + recipe


def test_checks_section_names_the_command_that_runs_the_checks():
    """The "Checks" section's make targets exist, and together run what it describes:
    helm lint on the chart, and the pytest suite that holds tests/chart/."""
    text = _section(README.read_text(), "Checks")
    named = re.findall(r"`make (\w[\w-]*)", text)
    assert named, text
    targets = _make_targets()
    for target in named:
        assert target in targets, f"the Makefile has no target {target}"
    runs = [line for target in named for line in _runs(target, targets)]
    assert any("$(HELM) lint" in line for line in runs), runs
    assert any("$(BIN)/pytest" in line for line in runs), runs


def test_make_chart_lints_every_variant_printing_only_warnings_and_errors(helm: Helm):
    """`make chart` runs helm lint --strict --quiet: on the chart as it is, every variant
    lints clean and prints nothing (not "[INFO] Chart.yaml: icon is recommended" once per
    variant); a warning would still be printed, and fail the lint."""
    lints = [line for line in _make_targets()["chart"][1] if "$(HELM) lint" in line]
    assert len(lints) == 2, lints  # the default values, then each ci/ variant
    assert all("$(HELM) lint --strict --quiet $(CHART)" in line for line in lints), lints
    variants = [(), *(("--values", str(path)) for path in sorted(CHART.glob("ci/*-values.yaml")))]
    for variant in variants:
        done = helm.run("lint", "--strict", "--quiet", str(CHART), *variant)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), variant


@pytest.mark.parametrize("readme", [ROOT / "README.md", README], ids=["repository", "chart"])
def test_install_commands_label_the_namespace_for_privileged_pods(readme: Path):
    """Each `helm install` shown is preceded, in its block, by the Pod Security label the
    chart requires on the namespace it installs into (the agent is privileged)."""
    blocks = re.findall(r"```sh\n(.*?)```", readme.read_text(), flags=re.DOTALL)
    installs = [block for block in blocks if "helm install" in block]
    assert installs, readme
    for block in installs:
        namespace = re.search(r"--namespace[= ](\S+)", block)
        assert namespace, block
        label = re.search(
            rf"kubectl label (?:ns|namespace) {re.escape(namespace.group(1))} "
            r"pod-security\.kubernetes\.io/enforce=privileged",
            block,
        )
        assert label, f"{readme.name}: no pod-security label for {namespace.group(1)}:\n{block}"
        assert label.start() < block.index("helm install"), block


def test_controller_rbac_table_is_what_the_chart_grants(helm: Helm):
    """The "Controller RBAC" table lists exactly the rules the controller's ClusterRole and
    Role grant (group, resource, verbs), each under the right kind."""
    manifests = helm.render("--set", "controller.enabled=true")
    granted = set()
    for kind in ("ClusterRole", "Role"):
        (role,) = [r for r in manifests.of_kind(kind) if r["metadata"]["name"] == CONTROLLER]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted.add((kind, group, resource, tuple(rule["verbs"])))
    table = set()
    for line in _section(README.read_text(), "Controller RBAC").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith(("ClusterRole", "Role")):
            continue
        kind = cells[0].split()[0]
        verbs = tuple(re.findall(r"`([a-z]+)`", cells[3]))
        table.add((kind, cells[1].strip("`").strip('"'), cells[2].strip("`"), verbs))
    assert table == granted


def test_readme_states_the_rendered_agent_selector_and_server_name(helm: Helm):
    """The agent selector the README gives is the one rendered (RELEASE for the release),
    and its example agent Certificate carries the server name the controller checks."""
    manifests = helm.render("--set", "controller.enabled=true", "--set", "grpc.tls.secretName=t")
    (container,) = [
        c
        for s in manifests.of_kind("StatefulSet")
        for c in s["spec"]["template"]["spec"]["containers"]
    ]
    flags = dict(a.split("=", 1) for a in container["args"] if a.startswith("--agent-"))
    text = README.read_text()
    assert flags["--agent-selector"].replace(f"instance={RELEASE}", "instance=RELEASE") in text
    certificate = re.search(r"kind: Certificate\n.*?```", text, flags=re.DOTALL)
    assert certificate, "no example Certificate"
    names = re.findall(r'^\s+- "([^"]+)"', certificate.group(0), flags=re.MULTILINE)
    assert flags["--agent-tls-server-name"] in names  # the example's namespace is gpu-system
