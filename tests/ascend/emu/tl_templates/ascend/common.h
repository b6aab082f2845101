#pragma once
#include "asc_emu.h"
