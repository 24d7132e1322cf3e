/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#include <common/test.h>
#include <uct/uct_test.h>

extern "C" {
#include <uct/usnic/usnic_iface.h>
}

class test_usnic_iface : public uct_test {
};

UCS_TEST_P(test_usnic_iface, placeholder) {
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_iface, usnic)
