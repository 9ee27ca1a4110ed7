"""``backbone=timm`` and ``backbone.init``: any timm model as the
trunk, released weights as its start -- loaded strictly, equal to the file before the first
step, the teacher equal to the student -- and every bad input in one line naming the key."""

from __future__ import annotations

import argparse

import pytest
import timm
import torch
import torchvision
from omegaconf import open_dict

from hvp_lightning import hub_reach
from hvp_lightning.config import check_options, validate
from hvp_lightning.errors import ConfigError
from hvp_lightning.nn.backbones import vit_tokens
from hvp_lightning.nn.teacher import has_batchnorm
from hvp_lightning.selection import frozen_state
from hvp_lightning.training.backbone_init import init_backbone
from hvp_lightning.training.build import build_backbone
from hvp_lightning.training.weights import read_state

from .conftest import build, make_cfg, tiered

TINY_VIT = ["backbone=timm", "backbone.name=vit_tiny_patch16_224", "+backbone.model_args.depth=1"]


def vit_cfg(*more: str, method: str = "dino_cifar"):
    """A tiny DINO run on a 1-block timm ViT-Tiny/16 at 32 px (local crops 16 px)."""
    return make_cfg(
        f"method={method}",
        *TINY_VIT,
        "backbone.img_size=32",
        "data.crop_size=32",
        "method.local_crop_size=16",
        "method.num_local_crops=2",
        "method.out_dim=64",
        "method.head_hidden_dim=32",
        "method.bottleneck_dim=16",
        *more,
    )


def trunk_state(model) -> dict[str, torch.Tensor]:
    return model.backbone.trunk.state_dict()


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def loaded(cfg):
    model = build(cfg)
    line = init_backbone(model, cfg.backbone, resuming=False)
    return model, line


# --- any timm model -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,args",
    [("resnet10t", {}), ("convnext_atto", {}), ("efficientnet_b0", {}), ("vit_tiny_patch16_224", {"depth": 1})],
)
def test_a_timm_trunk_is_timms_own_model_without_classifier(name, args):
    cfg = make_cfg("backbone=timm", f"backbone.name={name}", "data.crop_size=32").backbone
    with open_dict(cfg):
        cfg.model_args = args
    backbone = build_backbone(cfg)
    reference = timm.create_model(name, pretrained=False, num_classes=0, **args)
    assert backbone.trunk.state_dict().keys() == reference.state_dict().keys()  # timm's key names
    assert backbone.feature_dim == reference.num_features
    assert backbone(torch.randn(2, 3, 32, 32)).shape == (2, reference.num_features)


@pytest.mark.parametrize(
    "name",
    tiered(
        [
            "mobilenetv3_small_050",
            "mobilenetv4_conv_small",
            "ghostnet_050",
            "repghostnet_050",
            "hgnetv2_b0",
            "lcnet_050",
            "fbnetv3_b",
            "resnet10t",
            "convnext_atto",
            "vit_tiny_patch16_224",
        ],
        3,
    ),
)
def test_feature_dim_is_the_width_of_timms_pooled_output(name):
    """Mobile-family models put a head conv after the pooling: their output has
    ``head_hidden_size`` features, not ``num_features`` (the heads would not fit)."""
    cfg = make_cfg("backbone=timm", f"backbone.name={name}", "data.crop_size=32").backbone
    with torch.device("meta"):
        backbone = build_backbone(cfg)
        assert backbone(torch.empty(2, 3, 32, 32)).shape == (2, backbone.feature_dim)


def test_a_drop_path_rate_the_model_lacks_is_named():
    cfg = make_cfg("backbone=timm", "backbone.name=ghostnet_050", "backbone.drop_path_rate=0.1").backbone
    with torch.device("meta"), pytest.raises(ConfigError, match=r"^backbone.drop_path_rate=0.1 is not allowed: 0.0"):
        build_backbone(cfg)


def test_a_zero_drop_path_rate_is_passed_to_models_whose_own_default_is_not_zero():
    """nextvit_small's own default is 0.1: drop_path_rate=0.0 must reach it (left out, the model
    trained with stochastic depth), and GhostNet, which takes no rate, still builds at 0.0."""
    cfg = make_cfg("backbone=timm", "backbone.name=nextvit_small", "backbone.drop_path_rate=0.0").backbone
    with torch.device("meta"):
        trunk = build_backbone(cfg).trunk
    rates = [m.drop_prob for m in trunk.modules() if type(m).__name__ == "DropPath"]
    assert all(r == 0.0 for r in rates)
    cfg = make_cfg("backbone=timm", "backbone.name=ghostnet_050", "backbone.drop_path_rate=0.0").backbone
    with torch.device("meta"):
        build_backbone(cfg)


def test_register_tokens_are_skipped_by_the_token_path_and_masking_moves_only_patches():
    cfg = make_cfg(*TINY_VIT, "backbone.img_size=32", "data.crop_size=32").backbone
    with open_dict(cfg):
        cfg.model_args = {"depth": 1, "reg_tokens": 4, "no_embed_class": True}
    backbone = build_backbone(cfg).eval()
    assert backbone.trunk.num_prefix_tokens == 5
    x = torch.randn(2, 3, 48, 48)  # another size than img_size: a 3x3 grid
    cls, patches = vit_tokens(backbone, x)
    assert patches.shape == (2, 9, 192)
    torch.testing.assert_close(cls, backbone(x))  # the pooled feature is the class token
    mask = torch.zeros(2, 3, 3, dtype=torch.bool)
    mask[:, 1, 1] = True
    cls_m, patches_m = vit_tokens(backbone, x, mask, torch.zeros(1, 192))
    assert not torch.allclose(patches_m[:, 4], patches[:, 4])


@pytest.mark.parametrize("name", ["efficientnet_b0", "convnext_atto"])
def test_the_selection_pass_leaves_a_timm_models_state_untouched(name):
    cfg = make_cfg("backbone=timm", f"backbone.name={name}", "data.crop_size=32").backbone
    backbone = build_backbone(cfg).train()
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    with frozen_state(backbone, torch.device("cpu")):
        backbone(torch.randn(4, 3, 32, 32) * 3 + 1)
    assert_same(backbone.state_dict(), before)


def test_the_selection_pass_freezes_running_statistics_beyond_batchnorm():
    """timm's EvoNorm keeps a ``running_var`` outside any ``_BatchNorm``; a plain forward moves it."""
    from timm.layers import EvoNorm2dB0

    norm = EvoNorm2dB0(4).train()
    x = torch.randn(8, 4, 5, 5) * 3
    with frozen_state(norm, torch.device("cpu")):
        norm(x)
    assert torch.equal(norm.running_var, torch.ones(4))
    assert has_batchnorm(norm)  # batch-dependent: DINO's teacher outputs are not reused across batches
    norm(x)
    assert not torch.equal(norm.running_var, torch.ones(4))


# --- bad input, one line naming the key and value ------------------------------------------------
def test_an_unknown_timm_name_names_the_closest_ones():
    with pytest.raises(ConfigError, match=r"backbone.name='convnext_tinny' .*closest: convnext_tiny") as err:
        validate(make_cfg("backbone=timm", "backbone.name=convnext_tinny", "data.crop_size=32"))
    assert "\n" not in str(err.value)


def test_ibot_refuses_a_timm_model_without_vit_tokens_and_takes_a_timm_vit():
    ibot = ["method=ibot_cifar", "data.crop_size=32", "method.local_crop_size=16"]
    with pytest.raises(ConfigError, match=r"backbone.name='resnet10t' is not allowed for method=ibot: .* ResNet"):
        validate(make_cfg(*ibot, "backbone=timm", "backbone.name=resnet10t"))
    with pytest.raises(ConfigError, match=r"vit_base_patch16_siglip_224' is not allowed for method=ibot"):
        validate(make_cfg(*ibot, "backbone=timm", "backbone.name=vit_base_patch16_siglip_224"))  # no class token
    validate(make_cfg(*ibot, "backbone=timm", "backbone.name=vit_tiny_patch16_224", "backbone.img_size=32"))


def test_crops_must_fit_a_timm_vits_patch():
    with pytest.raises(ConfigError, match=r"method.local_crop_size=24 is not allowed: a multiple of .* patch size 16"):
        validate(vit_cfg("method.local_crop_size=24"))


def test_backbone_timm_without_a_name_says_how_to_give_one():
    with pytest.raises(
        ConfigError,
        match=r"^backbone.name is not set \(a timm model name, e.g. resnet50.*add backbone.name=\.\.\. to the command",
    ):
        check_options(make_cfg("backbone=timm"))


def test_a_missing_init_path_is_a_config_error():
    with pytest.raises(ConfigError, match=r"backbone.init='/nowhere/w.pth' is not allowed: .*no such file"):
        check_options(make_cfg("backbone.init=/nowhere/w.pth"))


def test_weights_of_another_architecture_stop_the_run_before_training(tmp_path):
    from hvp_lightning.training.driver import run

    weights = tmp_path / "vit.pth"
    torch.save(timm.create_model("vit_tiny_patch16_224", num_classes=0, depth=1).state_dict(), weights)
    with pytest.raises(ConfigError) as err:
        run(make_cfg(f"backbone.init={weights}"), tmp_path / "run")
    msg = str(err.value)
    assert msg.startswith(f"backbone.init='{weights}' is not allowed: its weights do not fit backbone.name='resnet18'")
    assert "missing: conv1.weight [8, 3, 3, 3]" in msg and "unexpected: cls_token [1, 1, 192]" in msg
    assert "\n" not in msg and not (tmp_path / "run" / "checkpoints").exists()


def test_a_text_file_and_a_whole_pickled_model_are_named_in_one_plain_line(tmp_path):
    from hvp_lightning.training.weights import read_state

    text, whole = tmp_path / "notes.txt", tmp_path / "model.pth"
    text.write_text("not weights\n")
    torch.save(torch.nn.Linear(2, 2), whole)
    for path, said in ((text, "not a weights file"), (whole, "a whole pickled model .*: save model.state_dict")):
        with pytest.raises(ConfigError, match=f"^backbone.init='.*' is not allowed: {said}") as err:
            read_state(str(path))
        assert "\n" not in str(err.value) and "\x1b" not in str(err.value)


def test_wrongly_shaped_keys_show_both_shapes(tmp_path):
    weights = tmp_path / "wide.pth"
    state = build_backbone(make_cfg("backbone.width=16").backbone).trunk.state_dict()
    torch.save(state, weights)
    with pytest.raises(ConfigError, match=r"wrongly shaped: conv1.weight file \[16, 3, 3, 3\] vs model \[8, 3, 3, 3\]"):
        loaded(make_cfg(f"backbone.init={weights}"))


def test_init_student_on_a_plain_state_dict_is_refused(tmp_path):
    weights = tmp_path / "w.pth"
    torch.save(build_backbone(make_cfg().backbone).trunk.state_dict(), weights)
    with pytest.raises(ConfigError, match=r"backbone.init_student=True is not allowed .* holds no student"):
        loaded(make_cfg(f"backbone.init={weights}", "backbone.init_student=true"))


# --- released weights as the start ----------------------------------------------------------------
@pytest.mark.parametrize(
    "backbone", [["backbone=resnet18", "backbone.width=64"], ["backbone=timm", "backbone.name=resnet18"]]
)
@pytest.mark.parametrize("source", ["torchvision", "timm"])
def test_resnet18_weights_from_torchvision_and_timm_load_into_both_backbones(tmp_path, backbone, source):
    if source == "torchvision":
        net = torchvision.models.resnet18()  # with its 1000-class fc: dropped, and said so
        weights = tmp_path / "resnet18.pth"
        torch.save(net.state_dict(), weights)
    else:
        from safetensors.torch import save_file

        net = timm.create_model("resnet18", num_classes=0)
        weights = tmp_path / "resnet18.safetensors"
        save_file(net.state_dict(), str(weights))
    model, line = loaded(make_cfg(*backbone, "data.crop_size=32", f"backbone.init={weights}"))
    expected = {k: v for k, v in net.state_dict().items() if not k.startswith("fc.")}
    assert_same(trunk_state(model), expected)
    assert ("dropped 2 head keys (fc.*)" in line) == (source == "torchvision"), line


def test_a_dino_checkpoint_gives_its_teacher_by_default_and_its_student_when_asked(tmp_path):
    """The official format: ``teacher`` without and ``student`` with DDP's ``module.``, both behind
    the multi-crop wrapper's ``backbone.``, heads beside them, arguments as a Namespace."""
    nets = {w: timm.create_model("vit_tiny_patch16_224", num_classes=0, depth=1, img_size=32) for w in ("t", "s")}
    head = {"head.mlp.0.weight": torch.randn(8, 192), "head.last_layer.weight_g": torch.randn(64, 1)}
    ckpt = {
        "teacher": {**{f"backbone.{k}": v for k, v in nets["t"].state_dict().items()}, **head},
        "student": {
            f"module.{k}": v
            for k, v in {**{f"backbone.{k}": v for k, v in nets["s"].state_dict().items()}, **head}.items()
        },
        "args": argparse.Namespace(arch="vit_tiny"),
        "epoch": 100,
    }
    path = tmp_path / "checkpoint.pth"
    torch.save(ckpt, path)
    for student, net in ((False, nets["t"]), (True, nets["s"])):
        model, line = loaded(vit_cfg(f"backbone.init={path}", f"backbone.init_student={student}"))
        assert_same(trunk_state(model), net.state_dict())
        assert_same(model.teacher["backbone"].trunk.state_dict(), net.state_dict())  # teacher = student at start
        assert ("the student of" if student else "the teacher of") in line and "(head.*)" in line


def test_position_embeddings_are_resized_to_the_runs_grid(tmp_path):
    """224 px / 16 px weights (14x14 grid) into a 64 px run (4x4): the class position kept, the
    grid resampled as timm does; another patch size is refused with both shapes."""
    from timm.layers import resample_abs_pos_embed

    net = timm.create_model("vit_tiny_patch16_224", num_classes=1000, depth=1)
    weights = tmp_path / "vit224.pth"
    torch.save(net.state_dict(), weights)
    model, line = loaded(vit_cfg(f"backbone.init={weights}", "backbone.img_size=64", "data.crop_size=64"))
    pos = model.backbone.trunk.pos_embed
    assert pos.shape == (1, 1 + 16, 192) and "from a 14x14 to a 4x4 patch grid" in line and "(head.*)" in line
    torch.testing.assert_close(pos, resample_abs_pos_embed(net.pos_embed.detach(), [4, 4], num_prefix_tokens=1))
    torch.testing.assert_close(pos[:, :1], net.pos_embed[:, :1].detach())
    cfg = vit_cfg(f"backbone.init={weights}")
    with open_dict(cfg):
        cfg.backbone.model_args.patch_size = 4
    with pytest.raises(ConfigError, match=r"patch_embed.proj.weight file \[192, 3, 16, 16\] vs model \[192, 3, 4, 4\]"):
        loaded(cfg)


@pytest.mark.slow  # an export, then a run started from it
def test_an_export_folder_and_a_run_dir_are_sources(tmp_path):
    from safetensors.torch import save_file

    from hvp_lightning.training.driver import run

    source = vit_cfg("data.train_size=32", "data.test_size=16")
    run(source, tmp_path / "first")
    ckpt = torch.load(tmp_path / "first" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    teacher = {
        k.removeprefix("teacher.backbone.trunk."): v for k, v in ckpt.items() if k.startswith("teacher.backbone.trunk.")
    }
    model, line = loaded(vit_cfg(f"backbone.init={tmp_path / 'first'}"))
    assert_same(trunk_state(model), teacher) and "the teacher" in line
    (tmp_path / "export").mkdir()
    save_file({k: v.contiguous() for k, v in teacher.items()}, str(tmp_path / "export" / "model.safetensors"))
    model, _ = loaded(vit_cfg(f"backbone.init={tmp_path / 'export'}"))
    assert_same(trunk_state(model), teacher)


def test_a_run_starts_from_the_file_and_resume_wins(tmp_path, monkeypatch, caplog):
    """Through the driver: the trunk equals the file when training starts; the teacher equals it too."""
    from hvp_lightning.methods.base import SSLMethod
    from hvp_lightning.training.driver import run

    net = timm.create_model("vit_tiny_patch16_224", num_classes=0, depth=1, img_size=32)
    weights = tmp_path / "vit.pth"
    torch.save(net.state_dict(), weights)
    seen = {}

    def on_train_start(self) -> None:  # a copy, as training moves the tensors on
        for key, trunk in (("s", self.backbone.trunk), ("t", self.teacher["backbone"].trunk)):
            seen[key] = {k: v.detach().cpu().clone() for k, v in trunk.state_dict().items()}

    monkeypatch.setattr(SSLMethod, "on_train_start", on_train_start, raising=False)
    cfg = vit_cfg(f"backbone.init={weights}", "data.train_size=32", "data.test_size=16")
    with caplog.at_level("INFO"):
        run(cfg, tmp_path / "run")
    assert_same(seen["s"], net.state_dict())
    assert_same(seen["t"], net.state_dict())
    assert f"backbone.init: {len(net.state_dict())} tensors from {weights}" in caplog.text
    model = build(cfg)
    before = {k: v.clone() for k, v in trunk_state(model).items()}
    line = init_backbone(model, cfg.backbone, resuming=True)
    assert line == f"backbone.init='{weights}' is not loaded: the run resumes from its checkpoint (resume wins)"
    assert_same(trunk_state(model), before)


# --- hubs, offline ---------------------------------------------------------------------------------
def test_offline_hub_names_say_where_to_put_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    cached = tmp_path / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    with pytest.raises(
        ConfigError, match=rf"backbone.init='torchvision:resnet18' is not in the local cache .*to {cached}"
    ):
        loaded(
            make_cfg(
                "backbone=resnet18", "backbone.width=64", "data.crop_size=32", "backbone.init=torchvision:resnet18"
            )
        )
    with pytest.raises(
        ConfigError,
        match=r"backbone.init='timm:resnet10t.c3_in1k' is not in the local cache .*hf download timm/resnet10t.c3_in1k",
    ):
        loaded(
            make_cfg(
                "backbone=timm", "backbone.name=resnet10t", "data.crop_size=32", "backbone.init=timm:resnet10t.c3_in1k"
            )
        )
    with pytest.raises(ConfigError, match=r"backbone.init='timm:resnet10t.nope' is not allowed: timm has no released"):
        loaded(
            make_cfg(
                "backbone=timm", "backbone.name=resnet10t", "data.crop_size=32", "backbone.init=timm:resnet10t.nope"
            )
        )
    net = torchvision.models.resnet18()
    cached.parent.mkdir(parents=True)
    torch.save(net.state_dict(), cached)  # a file in torch's hub cache loads without the network
    model, _ = loaded(
        make_cfg("backbone=resnet18", "backbone.width=64", "data.crop_size=32", "backbone.init=torchvision:resnet18")
    )
    assert_same(trunk_state(model), {k: v for k, v in net.state_dict().items() if not k.startswith("fc.")})


def _no_download(*args, **kwargs):
    raise AssertionError("a download was tried")


def test_a_hub_out_of_reach_fails_in_one_line_within_seconds(tmp_path, monkeypatch):
    """Without HF_HUB_OFFLINE and without a network (no name resolves, or the resolver never
    answers), a hub name not in the cache ends in one line naming the host, before any download
    (whose clients retry for a minute, warning at each try)."""
    import socket
    import time

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", _no_download)
    monkeypatch.setattr(timm, "create_model", _no_download)

    def no_name(*args):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    def no_answer(*args):
        time.sleep(5)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", no_name)
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        read_state("torchvision:resnet18")
    assert str(err.value).startswith(
        "backbone.init='torchvision:resnet18' is not in the local cache and the hub cannot be reached "
        "(download.pytorch.org:443: Name or service not known): download https://download.pytorch.org/"
    )
    monkeypatch.setattr(socket, "getaddrinfo", no_answer)
    monkeypatch.setattr(hub_reach, "PROBE_S", 0.2)
    with pytest.raises(
        ConfigError, match=r"cannot be reached \(huggingface.co:443: no answer within 0.2 s\): run `hf"
    ) as hung:
        read_state("timm:resnet10t.c3_in1k")
    assert time.monotonic() - start < 3
    assert "\n" not in str(err.value) + str(hung.value)


def test_a_hub_name_fails_in_seconds_on_this_machine_when_it_is_offline(tmp_path, monkeypatch):
    """The real thing where the machine has no network (skipped where it has one: tests download nothing)."""
    import time

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    if hub_reach.unreachable("https://download.pytorch.org") is None:
        pytest.skip("this machine reaches download.pytorch.org")
    start = time.monotonic()
    with pytest.raises(
        ConfigError, match=r"^backbone.init='torchvision:resnet18' is not in the local cache and the hub"
    ):
        read_state("torchvision:resnet18")
    assert time.monotonic() - start < hub_reach.PROBE_S + 1


def test_a_quoted_exception_is_cut_at_a_sentence_or_a_word():
    text = "An error happened while trying to locate the file on the Hub. Please check your connection and try again."
    assert hub_reach.first_words(text, 80) == "An error happened while trying to locate the file on the Hub."
    assert hub_reach.first_words("word " * 30, 22) == "word word word..."
    assert hub_reach.first_words("short\nsecond line", 80) == "short"


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ibot_cifar", "simclr_cifar"])
def test_a_timm_backbone_trains_with_registers_for_ibot_and_a_cnn_for_simclr(tmp_path, method):
    """A whole run: iBOT on a timm ViT with 4 register tokens (masked patch tokens, HVP on), SimCLR
    on a timm ConvNeXt with HVP's selection pass."""
    from hvp_lightning.training.driver import run

    backbone = (
        [
            *TINY_VIT,
            "backbone.img_size=32",
            "+backbone.model_args.reg_tokens=4",
            "+backbone.model_args.no_embed_class=true",
        ]
        if method.startswith("ibot")
        else ["backbone=timm", "backbone.name=convnext_atto"]
    )
    extra = ["method.local_crop_size=16", "method.num_local_crops=2", "method.out_dim=64", "method.patch_out_dim=64"]
    cfg = make_cfg(
        f"method={method}", *backbone, "data.crop_size=32", "+hvp=on", *(extra if method.startswith("ibot") else [])
    )
    summary = run(cfg, tmp_path)
    assert summary["hvp"]["selected_samples"] == cfg.data.train_size and summary["knn_top1"] is not None


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,key",
    [
        (["backbone=timm", "backbone.name=convnext_tinny"], "backbone.name='convnext_tinny'"),
        (["method=ibot_cifar", "backbone=timm", "backbone.name=resnet10t"], "backbone.name='resnet10t'"),
        (["backbone=timm", "backbone.name=resnet10t", "backbone.init=WEIGHTS"], "backbone.init='WEIGHTS'"),
    ],
)
def test_the_cli_answers_bad_backbone_input_in_one_line_without_checkpoints(tmp_path, args, key):
    import subprocess
    import sys

    from .conftest import REPO, SUBPROCESS_TIMEOUT_S

    weights = tmp_path / "vit.pth"
    torch.save(timm.create_model("vit_tiny_patch16_224", num_classes=0, depth=1).state_dict(), weights)
    args = [a.replace("WEIGHTS", str(weights)) for a in args]
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "train.py", *args, "data=synthetic", "logger=csv", "trainer=cpu", f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and out.count("config error:") == 1 and "Traceback" not in out, out[-2000:]
    assert f"config error: {key.replace('WEIGHTS', str(weights))} is not allowed" in proc.stderr
    assert not (run_dir / "checkpoints").exists()


def test_batchnorm_fused_with_an_activation_keeps_per_process_batchnorm():
    """timm's ``BatchNormAct2d`` (EfficientNet) would lose its activation in the conversion to
    ``SyncBatchNorm``: ``auto`` leaves it per process, ``true`` is refused in one line."""
    from hvp_lightning.cluster.distributed import sync_batchnorm_plugins

    efficientnet = build_backbone(make_cfg("backbone=timm", "backbone.name=efficientnet_b0").backbone)
    resnet = build_backbone(make_cfg("backbone=timm", "backbone.name=resnet10t").backbone)
    assert sync_batchnorm_plugins("auto", efficientnet) == [] and len(sync_batchnorm_plugins("auto", resnet)) == 1
    with pytest.raises(ConfigError, match=r"trainer.sync_batchnorm=True is not allowed .* BatchNormAct2d"):
        sync_batchnorm_plugins(True, efficientnet)


def test_img_size_is_refused_for_a_model_that_takes_none():
    with pytest.raises(
        ConfigError, match=r"backbone.img_size=64 is not allowed: null for resnet10t \(the model takes no img_size\)"
    ):
        validate(make_cfg("backbone=timm", "backbone.name=resnet10t", "backbone.img_size=64", "data.crop_size=32"))


@pytest.mark.slow  # timm models built on the meta device at several sizes
def test_a_model_built_for_one_input_size_is_refused_at_start_up_with_what_fits():
    """Swin and LeViT take their img_size only: the start-up check runs them (meta device) at the
    run's crop sizes and names the setting that fits, instead of an assertion at the first step."""
    swin = ["backbone=timm", "backbone.name=swin_tiny_patch4_window7_224", "data.crop_size=32"]
    with pytest.raises(ConfigError, match=r"^data.crop_size=32 is not allowed: .* set backbone.img_size=32$"):
        validate(make_cfg(*swin))
    validate(make_cfg(*swin, "backbone.img_size=32"))
    dino = ["method=dino_cifar", "method.local_crop_size=16", "method.num_local_crops=2"]
    with pytest.raises(ConfigError, match=r"set 'backbone.model_args=\{dynamic_img_size: true\}'$"):
        validate(make_cfg(*dino, *swin))
    validate(make_cfg(*dino, *swin, "backbone.model_args={dynamic_img_size: true}"))
    levit = ["backbone=timm", "backbone.name=levit_128s", "data.crop_size=32", "backbone.img_size=32"]
    with pytest.raises(ConfigError, match=r"^method.local_crop_size=16 is not allowed: a size levit_128s takes"):
        validate(make_cfg(*dino, *levit))


@pytest.mark.slow  # timm models built on the meta device
def test_a_cheaper_selection_the_model_cannot_score_is_refused_at_start_up():
    """hvp.selection_scale=0.5 scores 224 px crops at 112 px: a Swin built for 224 px fails there
    (an assertion at the first HVP step); with dynamic sizes it takes them."""
    swin = ["backbone=timm", "backbone.name=swin_tiny_patch4_window7_224", "data.crop_size=224"]
    said = (
        r"^hvp.selection_scale=0.5 is not allowed: 1 with swin_tiny_patch4_window7_224: "
        r"the selection pass scores data.crop_size=224 at 112 px; swin_tiny_patch4_window7_224 fails on 112 px"
    )
    with pytest.raises(ConfigError, match=said):
        validate(make_cfg(*swin, "+hvp=on", "hvp.selection_scale=0.5"))
    validate(make_cfg(*swin, "+hvp=on"))
    validate(make_cfg(*swin, "+hvp=on", "hvp.selection_scale=0.5", "backbone.model_args={dynamic_img_size: true}"))


def test_a_model_the_meta_device_cannot_run_is_not_refused_for_it(monkeypatch):
    """A forward that needs real values (a data-dependent branch) fails on the meta device at any
    size: that says nothing of the crops, so the run is not refused for it."""
    import hvp_lightning.backbone_checks as backbones

    def no_meta(backbone, size):
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")

    monkeypatch.setattr(backbones, "meta_output_shape", no_meta)
    validate(make_cfg("backbone=timm", "backbone.name=resnet10t", "data.crop_size=32"))


def test_an_unpooled_output_is_refused_naming_global_pool():
    cfg = make_cfg("backbone=timm", "backbone.name=resnet10t", "backbone.model_args={global_pool: ''}")
    with pytest.raises(ConfigError, match=r"^backbone.model_args=\{'global_pool': ''\} is not allowed: a global_pool"):
        validate(cfg)
