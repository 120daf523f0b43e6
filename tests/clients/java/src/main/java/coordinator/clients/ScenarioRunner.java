package coordinator.clients;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * What the scenario programs (Scenarios, ShareScenarios) share: running the chosen scenarios in
 * order, each on a daemon thread under a deadline, and printing one line of JSON for each:
 * {"scenario": NAME, "ok": BOOL, "detail": TEXT}; and the clients they all make.
 */
final class ScenarioRunner {
    interface Scenario {
        String run() throws Exception;
    }

    private ScenarioRunner() {
    }

    /** The scenarios named (all of them when none is), then exit 0: the lines say the rest. */
    static void runAll(Map<String, Scenario> all, List<String> names, Duration deadline) {
        List<String> chosen = names.isEmpty() ? new ArrayList<>(all.keySet()) : names;
        ExecutorService runner = Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r);
            t.setDaemon(true);
            return t;
        });
        for (String name : chosen) {
            Scenario scenario = all.get(name);
            if (scenario == null) {
                report(name, false, "no such scenario");
                continue;
            }
            Future<String> outcome = runner.submit(scenario::run);
            try {
                report(name, true, outcome.get(deadline.toSeconds() * 2, TimeUnit.SECONDS));
            } catch (TimeoutException e) {
                outcome.cancel(true);
                report(name, false, "timed out");
            } catch (ExecutionException e) {
                report(name, false, describe(e.getCause()));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                report(name, false, "interrupted");
            }
        }
        System.exit(0);
    }

    static String describe(Throwable error) {
        StringBuilder text = new StringBuilder();
        for (Throwable t = error; t != null; t = t.getCause()) {
            if (text.length() > 0) {
                text.append(" <- ");
            }
            text.append(t.getClass().getName()).append(": ").append(t.getMessage());
        }
        return text.toString();
    }

    static void report(String name, boolean ok, String detail) {
        System.out.println("{\"scenario\": " + Json.quote(name) + ", \"ok\": " + ok + ", \"detail\": " + Json.quote(detail) + "}");
        System.out.flush();
    }

    static void check(boolean condition, String what) {
        if (!condition) {
            throw new AssertionError(what);
        }
    }

    static String unique(String prefix) {
        return prefix + "-" + UUID.randomUUID().toString().substring(0, 8);
    }

    static Admin admin(String bootstrap, Duration deadline) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, (int) deadline.toMillis());
        return Admin.create(p);
    }

    static KafkaProducer<String, String> producer(String bootstrap, Duration deadline, Map<String, Object> extra) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, (int) deadline.toMillis());
        p.putAll(extra);
        return new KafkaProducer<>(p);
    }
}
