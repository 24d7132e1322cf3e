/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_TEST_H
#define UCT_USNIC_TEST_H

#include <common/test.h>
#include <uct/api/uct.h>

#include <vector>


namespace usnic_test {

/* length bytes at buffer as 1 to max_iov entries of random sizes, some
 * possibly empty */
static inline std::vector<uct_iov_t>
random_iov(uint8_t *buffer, size_t length, size_t max_iov)
{
    std::vector<uct_iov_t> iov(1 + ucs::rand() % max_iov);
    size_t offset = 0;

    for (size_t i = 0; i < iov.size(); ++i) {
        iov[i].buffer = buffer + offset;
        iov[i].length = (i == (iov.size() - 1)) ?
                        (length - offset) :
                        ucs::rand() % (length - offset + 1);
        iov[i].memh   = UCT_MEM_HANDLE_NULL;
        iov[i].stride = 0;
        iov[i].count  = 1;
        offset       += iov[i].length;
    }

    return iov;
}

} // namespace usnic_test

#endif
