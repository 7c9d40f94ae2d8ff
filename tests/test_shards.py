

def test_a_demystifying_study_in_two_shards_equals_the_whole(tmp_path, fake_mnist_root):
    # The studies computed piece by piece share ResumableStudy's sharding: weight-norms' curves here.
    study = get_experiment("weight-norms")
    config = dataclasses.replace(study.Config(), depths=(2, 3), activations=("linear",), epochs=3, relu_epochs=2)
    whole = study.run(config, tmp_path / "whole", progress=False)
    out = tmp_path / "shared"
    first = study.run(dataclasses.replace(config, shard="1/2"), out, progress=False)
    assert sorted(first["curves"]) == ["linear-L2"]
    study.run(dataclasses.replace(config, shard="2/2"), out, progress=False)
    merged = study.run(dataclasses.replace(config, merge=True), out, progress=False)

    def numbers(summary: dict) -> dict:
        return {k: {f: v for f, v in c.items() if f != "seconds"} for k, c in summary["curves"].items()}

    assert numbers(merged) == numbers(whole) and len(merged["curves"]) == 2
