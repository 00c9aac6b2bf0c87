// Toy sequence tasks: everything tasks/ offers, for callers that want the whole subsystem.
#pragma once
#include "tasks/algorithmic.h"
#include "tasks/chars.h"
#include "tasks/seq2seq.h"
#include "tasks/task.h"
#include "tasks/tokenizer.h"
