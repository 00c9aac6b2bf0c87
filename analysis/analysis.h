// Head analysis: everything analysis/ offers, for callers that want the whole subsystem.
#pragma once
#include "analysis/attention_maps.h"
#include "analysis/compare.h"
#include "analysis/finetune.h"
#include "analysis/head_scores.h"
#include "analysis/heads.h"
#include "analysis/l0_gates.h"
#include "analysis/logit_attribution.h"
#include "analysis/patching.h"
#include "analysis/pruning.h"
#include "analysis/report.h"
#include "analysis/stats.h"
#include "analysis/surgery.h"
