/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#include "usnic_test.h"

#include <fstream>
#include <sched.h>
#include <sstream>
#include <stdlib.h>


/*
 * Device locality on a synthetic machine: hwloc loads the topology from the
 * XML file named by HWLOC_XMLFILE, in which the device under test hangs off
 * a PCI function of one of two packages, each with its own NUMA node. The
 * thread is bound to the first package's CPU.
 */
class test_usnic_topo : public test_usnic_base {
public:
    void init()
    {
        /* No entity before the variable is set: the topology is loaded
         * again only while no usnic MD is open */
        uct_test::init();
        ASSERT_EQ(0, sched_getaffinity(0, sizeof(m_affinity), &m_affinity));
        for (m_cpu = 0; !CPU_ISSET(m_cpu, &m_affinity); ++m_cpu) {
        }
        if (m_cpu >= 31) {
            UCS_TEST_SKIP_R("first CPU too high for this topology");
        }

        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(m_cpu, &one);
        ASSERT_EQ(0, sched_setaffinity(0, sizeof(one), &one));
    }

    void cleanup()
    {
        uct_test::cleanup();
        for (const std::string &file : m_files) {
            unlink(file.c_str());
        }
        sched_setaffinity(0, sizeof(m_affinity), &m_affinity);
    }

protected:
    static const char *pci_busid() { return "0000:81:00.0"; }

    /* Latency and system device that an iface on the device reports, with
     * the given topology file (none: the machine's own) */
    void open_device(const std::string &xml, double *latency,
                     ucs_sys_device_t *sys_device)
    {
        char path[]                = "/tmp/usnic_topo_XXXXXX";
        uct_tl_resource_desc_t *resources;
        unsigned num_resources;
        int fd;

        /* A file of its own each time, kept until the test ends: the
         * topology is loaded again only when hwloc's source changes */
        if (!xml.empty()) {
            fd = mkstemp(path);
            ASSERT_GE(fd, 0);
            close(fd);
            m_files.push_back(path);
            std::ofstream(path) << xml;
            m_env.reset(new ucs::scoped_setenv("HWLOC_XMLFILE", path));
        }

        entity *e   = uct_test::create_entity(0);
        *latency    = e->iface_attr().latency.c;
        *sys_device = UCS_SYS_DEVICE_ID_UNKNOWN;
        ASSERT_UCS_OK(uct_md_query_tl_resources(e->md(), &resources,
                                                &num_resources));
        for (unsigned i = 0; i < num_resources; ++i) {
            if (GetParam()->dev_name == resources[i].dev_name) {
                *sys_device = resources[i].sys_device;
            }
        }
        uct_release_tl_resource_list(resources);

        delete e;
        m_env.reset();
    }

    /* Two packages with one CPU and one NUMA node each; the device on the
     * far one's PCI function, or the near one's */
    std::string topology_xml(bool far, bool distances) const
    {
        unsigned near_set = 1u << m_cpu, far_set = 2u << m_cpu;
        std::ostringstream xml;

        xml << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            << "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
            << "<topology version=\"2.0\">\n"
            << "<object type=\"Machine\" os_index=\"0\""
            << sets(near_set | far_set, 0x3) << " allowed_cpuset=\"0x"
            << std::hex << (near_set | far_set) << std::dec
            << "\" allowed_nodeset=\"0x3\" gp_index=\"1\">\n"
            << package(0, m_cpu, near_set, !far)
            << package(1, m_cpu + 1, far_set, far) << "</object>\n";
        if (distances) {
            xml << "<distances2 type=\"NUMANode\" nbobjs=\"2\" kind=\"5\""
                << " name=\"NUMALatency\" indexing=\"os\">\n"
                << "<indexes length=\"4\">0 1 </indexes>\n"
                << "<u64values length=\"12\">10 21 21 10 </u64values>\n"
                << "</distances2>\n";
        }
        xml << "</topology>\n";
        return xml.str();
    }

private:
    static std::string sets(unsigned cpuset, unsigned nodeset)
    {
        std::ostringstream attrs;

        attrs << std::hex << " cpuset=\"0x" << cpuset
              << "\" complete_cpuset=\"0x" << cpuset << "\" nodeset=\"0x"
              << nodeset << "\" complete_nodeset=\"0x" << nodeset << "\"";
        return attrs.str();
    }

    std::string package(unsigned index, unsigned cpu, unsigned cpuset,
                        bool with_device) const
    {
        unsigned gp = 10 * (index + 1);
        std::ostringstream xml;

        xml << "<object type=\"Package\" os_index=\"" << index << "\""
            << sets(cpuset, 1u << index) << " gp_index=\"" << gp << "\">\n"
            << "<object type=\"NUMANode\" os_index=\"" << index << "\""
            << sets(cpuset, 1u << index) << " gp_index=\"" << gp + 1
            << "\" local_memory=\"1073741824\"/>\n"
            << "<object type=\"PU\" os_index=\"" << cpu << "\""
            << sets(cpuset, 1u << index) << " gp_index=\"" << gp + 2
            << "\"/>\n";
        if (with_device) {
            xml << "<object type=\"PCIDev\" gp_index=\"" << gp + 3
                << "\" pci_busid=\"" << pci_busid() << "\""
                << " pci_type=\"0200 [1137:0043] [1137:012a] 00\""
                << " pci_link_speed=\"0.000000\">\n"
                << "<object type=\"OSDev\" gp_index=\"" << gp + 4
                << "\" name=\"" << GetParam()->dev_name
                << "\" osdev_type=\"2\"/>\n"
                << "</object>\n";
        }
        xml << "</object>\n";
        return xml.str();
    }

    cpu_set_t                           m_affinity;
    unsigned                            m_cpu;
    std::unique_ptr<ucs::scoped_setenv> m_env;
    std::vector<std::string>            m_files; /* Topologies written */
};

UCS_TEST_P(test_usnic_topo, virtual_device) {
    double latency;
    ucs_sys_device_t sys_device;

    /* This machine's interfaces under test are virtual: no PCI function */
    open_device("", &latency, &sys_device);
    EXPECT_EQ(UCS_SYS_DEVICE_ID_UNKNOWN, sys_device);
}

UCS_TEST_P(test_usnic_topo, far_device_reports_higher_latency) {
    double base, near, far, far_distances;
    ucs_sys_device_t sys_device;
    char bdf[UCS_SYS_BDF_NAME_MAX];

    open_device("", &base, &sys_device);

    open_device(topology_xml(false, false), &near, &sys_device);
    ASSERT_NE(UCS_SYS_DEVICE_ID_UNKNOWN, sys_device);
    EXPECT_EQ(std::string(pci_busid()),
              ucs_topo_sys_device_bdf_name(sys_device, bdf, sizeof(bdf)));
    EXPECT_NEAR(base, near, 1e-12);

    /* No NUMA distances known: a flat 200 nsec */
    open_device(topology_xml(true, false), &far, &sys_device);
    EXPECT_NEAR(base + 200e-9, far, 1e-12);

    /* Distance 21 against 10 local: 11 units of 20 nsec */
    open_device(topology_xml(true, true), &far_distances, &sys_device);
    EXPECT_NEAR(base + 220e-9, far_distances, 1e-12);
}

UCS_TEST_P(test_usnic_topo, prefer_nearest_device_off) {
    double base, far;
    ucs_sys_device_t sys_device;

    open_device("", &base, &sys_device);
    set_usnic_config("PREFER_NEAREST_DEVICE", "n");
    open_device(topology_xml(true, true), &far, &sys_device);
    EXPECT_NE(UCS_SYS_DEVICE_ID_UNKNOWN, sys_device);
    EXPECT_NEAR(base, far, 1e-12);
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_topo, usnic)
