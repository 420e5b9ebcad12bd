// Experiment config: YAML + dotted overrides, unknown keys with a did-you-mean, type errors,
// every validation rule's message, the resolved YAML round trip, the configs/ files, and
// docs/config.md listing every key.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "deltatron/io/config.h"

using namespace dt::io;

namespace {
std::string write_tmp(const char* name, const std::string& text) {
  std::string p = ::testing::TempDir() + name;
  std::ofstream(p) << text;
  return p;
}
std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

TEST(Config, YamlThenOverridesInOrder) {
  std::string p = write_tmp("c1.yaml", "model:\n  hidden_size: 96\n  layer_types: [linear_attention, full_attention]\n"
                                       "  num_hidden_layers: 2\nparallel:\n  tp: 2\ndata:\n  shuffle: false\n");
  Config c;
  ASSERT_EQ(load_config(p, {"parallel.cp=2", "optimizer.lr=1e-3", "parallel.cp=4", "train.precision=fp32"}, &c), "");
  EXPECT_EQ(c.model.hidden_size, 96);
  EXPECT_EQ(c.model.layer_types.size(), 2u);
  EXPECT_EQ(c.parallel.tp, 2);
  EXPECT_EQ(c.parallel.cp, 4);  // the last override wins
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.train.precision, "fp32");
  EXPECT_EQ(c.model.vocab_size, 248320);  // defaults stay
}

TEST(Config, UnknownKeysSuggestTheNearest) {
  Config c;
  std::string p = write_tmp("c2.yaml", "model:\n  hiden_size: 96\n");
  EXPECT_EQ(load_config(p, {}, &c),
            p + ": config: unknown key 'model.hiden_size' (did you mean 'model.hidden_size'?) ---> hint: docs/config.md "
                "lists every key");
  EXPECT_NE(load_config("", {"parallel.pt=2"}, &c).find("(did you mean 'parallel.tp'?)"), std::string::npos);
  EXPECT_NE(load_config("", {"optimizer.warmup_steps=5"}, &c).find("did you mean 'schedule.warmup_steps'?"),
            std::string::npos);
  EXPECT_NE(load_config("", {"tp"}, &c).find("override 'tp' must look like section.key=value"), std::string::npos);
}

TEST(Config, TypeErrorsNameKeyAndValue) {
  Config c;
  EXPECT_EQ(load_config("", {"model.hidden_size=wide"}, &c), "--set: config: model.hidden_size = wide: expected integer");
  EXPECT_EQ(load_config("", {"data.shuffle=maybe"}, &c), "--set: config: data.shuffle = maybe: expected bool");
  std::string p = write_tmp("c3.yaml", "model:\n  layer_types: linear_attention\n");
  EXPECT_EQ(load_config(p, {}, &c), p + ": config: model.layer_types = linear_attention: expected list of strings");
  EXPECT_NE(load_config(write_tmp("c4.yaml", "model: 3\n"), {}, &c).find("c4.yaml: section 'model' must be a map"),
            std::string::npos);
  EXPECT_NE(load_config(write_tmp("c5.yaml", "modle: 3\n"), {}, &c).find("unknown key 'modle'"), std::string::npos);
  EXPECT_NE(load_config("/nonexistent/x.yaml", {}, &c).find("cannot read '/nonexistent/x.yaml'"), std::string::npos);
}

// Files that parse as YAML but are no experiment: each an error naming the file and what is wrong
// (a directory and non-scalar keys threw out of the loader; a repeated key and a second document
// were silently resolved).
TEST(Config, MalformedFilesAreErrors) {
  Config c;
  const std::string dir = ::testing::TempDir();
  EXPECT_NE(load_config(dir, {}, &c).find("is a directory, not a YAML file"), std::string::npos);
  std::string p = write_tmp("m1.yaml", "[a, b]: 1\n");
  EXPECT_EQ(load_config(p, {}, &c), "config: " + p + ": a section name must be a plain name, got '[a, b]'");
  p = write_tmp("m2.yaml", "model:\n  [a, b]: 1\n");
  EXPECT_EQ(load_config(p, {}, &c), "config: " + p + ": a key of section 'model' must be a plain name, got '[a, b]'");
  p = write_tmp("m3.yaml", "model:\n  hidden_size: 64\n  hidden_size: 128\n");
  EXPECT_EQ(load_config(p, {}, &c), "config: " + p + ": key 'model.hidden_size' appears twice");
  p = write_tmp("m4.yaml", "model:\n  hidden_size: 64\ntrain:\n  steps: 3\nmodel:\n  vocab_size: 96\n");
  EXPECT_EQ(load_config(p, {}, &c), "config: " + p + ": section 'model' appears twice");
  p = write_tmp("m5.yaml", "model:\n  hidden_size: 64\n---\nmodel:\n  hidden_size: 128\n");
  EXPECT_EQ(load_config(p, {}, &c), "config: " + p + " holds 2 YAML documents ('---'); one experiment file is one document");
  p = write_tmp("m6.yaml", "");  // empty: the defaults
  EXPECT_EQ(load_config(p, {}, &c), "");
  EXPECT_EQ(c.model.hidden_size, 1024);
}

TEST(Config, ValidationRulesNameTheValues) {
  auto check = [](std::vector<std::string> sets, int world) {
    Config c;
    EXPECT_EQ(load_config("", sets, &c), "");
    return validate_config(c, world);
  };
  EXPECT_EQ(check({}, 1), "");
  EXPECT_EQ(check({"parallel.tp=2", "parallel.cp=2", "parallel.dp=1"}, 2),
            "parallel: tp 2 x cp 2 x dp 1 = 4, but the world size is 2 ---> hint: launch 4 ranks, or set dp to -1 to "
            "infer it");
  EXPECT_EQ(check({"parallel.tp=3"}, 4),
            "parallel: tp 3 x cp 1 = 3 does not divide the world size 4, so dp (inferred as world / (tp*cp)) is not an "
            "integer ---> hint: launch a multiple of 3 ranks, or change tp/cp");
  EXPECT_EQ(check({"parallel.tp=2", "parallel.cp=16"}, 32),
            "config: GDN head-parallel CP needs tp*cp=32 to divide linear_num_key_heads=16 and linear_num_value_heads=16");
  EXPECT_EQ(check({"model.linear_num_value_heads=24"}, 1),
            "config: model.linear_num_value_heads=24 is not a multiple of model.linear_num_key_heads=16");
  EXPECT_EQ(check({"parallel.cp=2", "data.max_tokens=8190"}, 2),
            "config: data.max_tokens=8190 must be a multiple of 2*parallel.cp=4 (next valid 8192)");
  EXPECT_EQ(check({"parallel.cp=2", "data.pad_multiple=6"}, 2),
            "config: data.pad_multiple=6 must be a multiple of 2*parallel.cp=4");
  EXPECT_EQ(check({"parallel.tp=4"}, 4), "config: parallel.tp=4 must divide model.num_key_value_heads=2 (attention heads split over tp)");
  EXPECT_EQ(check({"optimizer.name=adam"}, 1), "config: optimizer.name = 'adam' is not one of: adamw, sgd");
  EXPECT_EQ(check({"train.precision=fp16"}, 1), "config: train.precision = 'fp16' is not one of: bf16, fp32");
  EXPECT_EQ(check({"gdn.cp_a2a=ring"}, 1), "config: gdn.cp_a2a = 'ring' is not one of: fused, per_sequence");
  EXPECT_EQ(check({"gdn.cp_comm=all_reduce"}, 1),
            "config: gdn.cp_comm = 'all_reduce' is not one of: auto, all_to_all, all_gather");
  EXPECT_EQ(check({"gdn.cp_comm=all_gather", "parallel.cp=2"}, 2), "");
  EXPECT_EQ(check({"model.num_hidden_layers=3", "model.layer_types=[linear_attention]"}, 1),
            "config: model.layer_types has 1 entries but model.num_hidden_layers=3");
  EXPECT_EQ(check({"model.num_hidden_layers=1", "model.layer_types=[mamba]"}, 1),
            "config: model.layer_types[0] = 'mamba' is not one of: linear_attention, full_attention");
  EXPECT_EQ(check({"model.vocab_size=248321", "parallel.tp=2", "model.num_key_value_heads=2"}, 2),
            "config: parallel.tp=2 must divide model.vocab_size=248321 (next valid size 248322)");
  // Model sizes before any rule divides by them (a zero head count was a SIGFPE).
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "linear_num_key_heads",
                          "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "num_attention_heads",
                          "num_key_value_heads", "head_dim"})
    EXPECT_EQ(check({std::string("model.") + key + "=0"}, 1), std::string("config: model.") + key + "=0 must be >= 1");
  EXPECT_EQ(check({"model.linear_key_head_dim=-16"}, 1), "config: model.linear_key_head_dim=-16 must be >= 1");
  EXPECT_EQ(check({"model.rms_norm_eps=-1"}, 1), "config: model.rms_norm_eps=-1 must be finite and > 0");
  EXPECT_EQ(check({"model.rope_theta=.inf"}, 1), "config: model.rope_theta=inf must be finite and > 0");
  EXPECT_EQ(check({"model.partial_rotary_factor=1.5"}, 1), "config: model.partial_rotary_factor=1.5 must be in [0, 1]");
  EXPECT_EQ(check({"model.initializer_range=.nan"}, 1), "config: model.initializer_range=nan must be finite and >= 0");
  EXPECT_EQ(check({"train.max_nonfinite_in_a_row=0"}, 1), "config: train.max_nonfinite_in_a_row=0 must be >= 1");
  EXPECT_EQ(check({"checkpoint.interval=-1"}, 1), "config: checkpoint.interval=-1 must be >= 0 (0 = only at the end)");
}

TEST(Config, ResolvedYamlRoundTrips) {
  Config a;
  ASSERT_EQ(load_config("", {"model.hidden_size=80", "model.layer_types=[linear_attention, full_attention]",
                             "model.num_hidden_layers=2", "optimizer.lr=0.000123456789", "data.prefix=/d/x y"},
                        &a),
            "");
  std::string y = config_to_yaml(a);
  Config b;
  ASSERT_EQ(load_config(write_tmp("rt.yaml", y), {}, &b), "");
  EXPECT_EQ(config_to_yaml(b), y);
  EXPECT_DOUBLE_EQ(b.optimizer.lr, 0.000123456789);
  EXPECT_EQ(b.data.prefix, "/d/x y");
  // The default layer pattern: HF's (i + 1) % 4 == 0 is full attention.
  Config d;
  d.model.num_hidden_layers = 8;
  auto t = resolved_layer_types(d.model);
  EXPECT_EQ(t[3], "full_attention");
  EXPECT_EQ(t[7], "full_attention");
  EXPECT_EQ(t[0], "linear_attention");
}

TEST(Config, ShippedConfigsValidateUnderTheirLayouts) {
  Config q;
  ASSERT_EQ(load_config(DT_SOURCE_DIR "/configs/quickstart.yaml", {}, &q), "");
  EXPECT_EQ(validate_config(q, 1), "");
  for (auto [tp, cp] : {std::pair{2, 1}, {1, 2}, {2, 2}, {4, 1}, {1, 4}}) {  // every tp*cp <= 4
    Config c;
    ASSERT_EQ(load_config(DT_SOURCE_DIR "/configs/quickstart.yaml",
                          {"parallel.tp=" + std::to_string(tp), "parallel.cp=" + std::to_string(cp)}, &c),
              "");
    EXPECT_EQ(validate_config(c, tp * cp), "") << "tp " << tp << " cp " << cp;
  }
  Config b;
  ASSERT_EQ(load_config(DT_SOURCE_DIR "/configs/bench-0.8b.yaml", {}, &b), "");
  EXPECT_EQ(validate_config(b, 1), "");
  EXPECT_EQ(validate_config(b, 0), "");
}

TEST(Config, DocsListEveryKey) {
  std::string doc = slurp(DT_SOURCE_DIR "/docs/config.md");
  EXPECT_NE(doc.find(config_keys_markdown()), std::string::npos)
      << "docs/config.md is out of date; its key table must be:\n" << config_keys_markdown();
}
