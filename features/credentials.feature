@fake-coderd
Feature: Credential Secrets referenced by extraEnv
  Each Secret named by an extraEnv secretKeyRef must carry the label coder.com/credential=true
  and the annotation coder.com/credential-destinations listing the origin of the control
  plane's status.url. Otherwise CredentialsReady is False and the operator changes nothing.
  In the Secrets below, {origin} stands for that origin and {authority} for its host:port.

  Background:
    Given a Ready control plane with operator access

  @R-CRED-2 @tutorial @core
  Scenario: A provisioner without credential Secrets has valid credentials
    When the sample provisioner is applied
    Then the provisioner has condition "CredentialsReady" "True" with reason "CredentialsValid"

  @R-CRED-1 @R-CRED-13 @R-POD-13 @tutorial @core
  Scenario: A Secret cleared for the control plane's origin is used verbatim
    Given a credential Secret "proxy-credentials" with metadata:
      """
      labels:
        coder.com/credential: "true"
      annotations:
        coder.com/credential-destinations: "https://other.example.com, {origin}"
      """
    When the sample provisioner is applied with spec:
      """
      extraEnv:
        - name: PROXY_PASSWORD
          valueFrom:
            secretKeyRef:
              name: proxy-credentials
              key: value
      """
    # checks: R-CRED-1
    Then the provisioner has condition "CredentialsReady" "True" with reason "CredentialsValid"
    # checks: R-CRED-1
    And the provisioner becomes Ready
    # checks: R-CRED-13, R-POD-13
    And the provisioner container's env is:
      | name                         | value | secret                        |
      | CODER_URL                    | {url} |                               |
      | CODER_PROVISIONER_DAEMON_KEY |       | {provisioner}-provisioner-key/key |
      | PROXY_PASSWORD               |       | proxy-credentials/value       |

  @R-CRED-3 @R-CRED-4 @R-CRED-5 @R-CRED-6 @R-CRED-7 @R-CRED-9 @R-CRED-15 @D-2 @tutorial @core
  Scenario Outline: A credential Secret that is not cleared blocks the provisioner: <case>
    Given a credential Secret "proxy-credentials" with metadata:
      """
      labels: <labels>
      annotations: <annotations>
      """
    When the sample provisioner is applied with spec:
      """
      extraEnv:
        - name: PROXY_PASSWORD
          valueFrom:
            secretKeyRef:
              name: <secret>
              key: value
      """
    # checks: R-CRED-3, R-CRED-4, R-CRED-5, R-CRED-6, R-CRED-7, R-CRED-15, D-2
    Then the provisioner has condition "CredentialsReady" "False" with reason "<reason>"
    # checks: R-CRED-9
    And coderd saw no provisioner key requests
    # checks: none
    And no child object of the provisioner exists during the observation window

    Examples:
      | case                      | secret            | labels                         | annotations                                                      | reason                        |
      | label missing             | proxy-credentials | {}                             | {coder.com/credential-destinations: "{origin}"}                  | CredentialLabelMissing        |
      | label not "true"          | proxy-credentials | {coder.com/credential: "yes"}  | {coder.com/credential-destinations: "{origin}"}                  | CredentialLabelMissing        |
      | label "True", not "true"  | proxy-credentials | {coder.com/credential: "True"} | {coder.com/credential-destinations: "{origin}"}                  | CredentialLabelMissing        |
      | annotation missing        | proxy-credentials | {coder.com/credential: "true"} | {}                                                               | CredentialDestinationMissing  |
      | another origin            | proxy-credentials | {coder.com/credential: "true"} | {coder.com/credential-destinations: "https://coder.example.com"} | CredentialDestinationMismatch |
      | lookalike host suffix     | proxy-credentials | {coder.com/credential: "true"} | {coder.com/credential-destinations: "http://127.0.0.1.evil.test"} | CredentialDestinationMismatch |
      | lookalike path            | proxy-credentials | {coder.com/credential: "true"} | {coder.com/credential-destinations: "http://evil.test/{authority}"} | CredentialDestinationMismatch |
      | lookalike userinfo        | proxy-credentials | {coder.com/credential: "true"} | {coder.com/credential-destinations: "http://{authority}@evil.test"} | CredentialDestinationMismatch |
      | origin with a user        | proxy-credentials | {coder.com/credential: "true"} | {coder.com/credential-destinations: "http://someone@{authority}"} | CredentialDestinationMismatch |
      | origin with user:password | proxy-credentials | {coder.com/credential: "true"} | {coder.com/credential-destinations: "http://someone:pw@{authority}"} | CredentialDestinationMismatch |
      | origin with a path        | proxy-credentials | {coder.com/credential: "true"} | {coder.com/credential-destinations: "{origin}/api"}              | CredentialDestinationMismatch |
      | wildcard                  | proxy-credentials | {coder.com/credential: "true"} | {coder.com/credential-destinations: "*"}                         | CredentialDestinationMismatch |
      | Secret does not exist     | no-such-secret    | {coder.com/credential: "true"} | {coder.com/credential-destinations: "{origin}"}                  | CredentialSecretNotFound      |

  @R-CRED-6 @R-CRED-10 @D-2 @core
  Scenario Outline: The destination <destination> <verdict> the control plane URL <url>
    Given the control plane status is changed to:
      """
      url: "<url>"
      """
    And a credential Secret "proxy-credentials" with metadata:
      """
      labels: {coder.com/credential: "true"}
      annotations: {coder.com/credential-destinations: "<destination>"}
      """
    When the sample provisioner is applied with spec:
      """
      extraEnv:
        - name: PROXY_PASSWORD
          valueFrom:
            secretKeyRef: {name: proxy-credentials, key: value}
      """
    # checks: R-CRED-6, R-CRED-10, D-2
    Then the provisioner has condition "CredentialsReady" "<status>" with reason "<reason>"

    Examples: the same origin written another way
      | url                             | destination                       | verdict | status | reason           |
      | https://coder.example.com       | https://coder.example.com:443     | matches | True   | CredentialsValid |
      | https://coder.example.com:443   | https://coder.example.com         | matches | True   | CredentialsValid |
      | http://coder.example.com        | http://coder.example.com:80       | matches | True   | CredentialsValid |
      | http://coder.example.com:8080   | http://coder.example.com:8080     | matches | True   | CredentialsValid |
      | https://Coder.Example.COM       | https://coder.example.com         | matches | True   | CredentialsValid |
      | https://coder.example.com       | HTTPS://CODER.EXAMPLE.COM         | matches | True   | CredentialsValid |
      | https://coder.example.com/coder | https://coder.example.com         | matches | True   | CredentialsValid |
      | https://[2001:db8::1]:8443      | https://[2001:db8::1]:8443        | matches | True   | CredentialsValid |

    Examples: a list of origins, however it is spaced
      | url                       | destination                                            | verdict | status | reason           |
      | https://coder.example.com | https://other.example.com,https://coder.example.com    | matches | True   | CredentialsValid |
      | https://coder.example.com | https://coder.example.com,https://other.example.com    | matches | True   | CredentialsValid |
      | https://coder.example.com | https://other.example.com ,  https://coder.example.com | matches | True   | CredentialsValid |

    Examples: another origin
      | url                             | destination                           | verdict        | status | reason                        |
      | https://coder.example.com:8443  | https://coder.example.com             | does not match | False  | CredentialDestinationMismatch |
      | https://coder.example.com       | https://coder.example.com:8443        | does not match | False  | CredentialDestinationMismatch |
      | https://coder.example.com:8443  | https://coder.example.com:9443        | does not match | False  | CredentialDestinationMismatch |
      | http://coder.example.com        | http://coder.example.com:443          | does not match | False  | CredentialDestinationMismatch |
      | https://coder.example.com       | http://coder.example.com:443          | does not match | False  | CredentialDestinationMismatch |
      | https://coder.example.com       | https://coder.example.com.            | does not match | False  | CredentialDestinationMismatch |
      | https://[2001:db8::1]:8443      | https://[2001:db8::1]                 | does not match | False  | CredentialDestinationMismatch |
      | https://[2001:db8::1]:8443      | https://[2001:db8::2]:8443            | does not match | False  | CredentialDestinationMismatch |
      | https://coder.example.com       | https://user:pass@coder.example.com   | does not match | False  | CredentialDestinationMismatch |
      | https://coder.example.com       | https://coder.example.com/api         | does not match | False  | CredentialDestinationMismatch |

  @R-CRED-14 @core
  Scenario: Only secretKeyRef entries are checked, and never the provisioner's own key Secret
    When the sample provisioner is applied with spec:
      """
      extraEnv:
        - name: PLAIN_VALUE
          value: "plain"
        - name: FROM_CONFIG_MAP
          valueFrom:
            configMapKeyRef: {name: not-a-credential, key: value, optional: true}
        - name: FROM_FIELD
          valueFrom:
            fieldRef: {fieldPath: metadata.name}
        - name: FROM_RESOURCE
          valueFrom:
            resourceFieldRef: {containerName: provisioner, resource: limits.memory}
        - name: OWN_KEY
          valueFrom:
            secretKeyRef: {name: coderprovisioner-sample-provisioner-key, key: key}
      """
    Then the provisioner has condition "CredentialsReady" "True" with reason "CredentialsValid"
    And the provisioner becomes Ready

  @R-CRED-7 @R-CRED-3 @D-2 @core
  Scenario Outline: Every referenced Secret is checked on its own: <case>
    Given a credential Secret "proxy-credentials" with metadata:
      """
      labels: {coder.com/credential: "true"}
      annotations: {coder.com/credential-destinations: "{origin}"}
      """
    And a credential Secret "unlabeled-credentials" with metadata:
      """
      annotations: {coder.com/credential-destinations: "{origin}"}
      """
    When the sample provisioner is applied with spec:
      """
      extraEnv:
        - name: FIRST
          valueFrom:
            secretKeyRef: {name: <first>, key: value<first optional>}
        - name: SECOND
          valueFrom:
            secretKeyRef: {name: <second>, key: value<second optional>}
      """
    # checks: R-CRED-7, R-CRED-3, D-2
    Then the provisioner has condition "CredentialsReady" "<status>" with reason "<reason>"

    Examples:
      | case                                                  | first             | first optional   | second         | second optional  | status | reason                   |
      | an optional reference to a Secret without the label   | unlabeled-credentials | , optional: true | proxy-credentials |            | False  | CredentialLabelMissing   |
      | a cleared Secret, then a missing one                  | proxy-credentials |                  | no-such-secret |                  | False  | CredentialSecretNotFound |
      | a missing Secret, optional first, then required       | no-such-secret    | , optional: true | no-such-secret |                  | False  | CredentialSecretNotFound |
      | a missing Secret, required first, then optional       | no-such-secret    |                  | no-such-secret | , optional: true | False  | CredentialSecretNotFound |
      | a missing Secret, optional both times                 | no-such-secret    | , optional: true | no-such-secret | , optional: true | True   | CredentialsValid         |

  @R-CRED-7 @D-2 @core
  Scenario: An optional reference to a missing Secret is allowed
    When the sample provisioner is applied with spec:
      """
      extraEnv:
        - name: PROXY_PASSWORD
          valueFrom:
            secretKeyRef:
              name: no-such-secret
              key: value
              optional: true
      """
    # checks: R-CRED-7, D-2
    Then the provisioner has condition "CredentialsReady" "True" with reason "CredentialsValid"
    # checks: D-2
    And the provisioner becomes Ready

  # The Secret to fix is not the first one referenced: every reference is watched.
  @R-CRED-11 @extended
  Scenario: Fixing the Secret lets the provisioner proceed without editing it
    Given a credential Secret "proxy-user" with metadata:
      """
      labels:
        coder.com/credential: "true"
      annotations:
        coder.com/credential-destinations: "{origin}"
      """
    And a credential Secret "proxy-credentials" with metadata:
      """
      labels:
        coder.com/credential: "true"
      """
    When the sample provisioner is applied with spec:
      """
      extraEnv:
        - name: PROXY_USER
          valueFrom:
            secretKeyRef:
              name: proxy-user
              key: value
        - name: PROXY_PASSWORD
          valueFrom:
            secretKeyRef:
              name: proxy-credentials
              key: value
      """
    Then the provisioner has condition "CredentialsReady" "False" with reason "CredentialDestinationMissing"
    When the credential Secret "proxy-credentials" metadata is changed to:
      """
      annotations:
        coder.com/credential-destinations: "{origin}"
      """
    Then the provisioner has condition "CredentialsReady" "True" with reason "CredentialsValid"
    And the provisioner becomes Ready

  @R-CRED-8 @D-1 @tutorial @core
  Scenario: While credentials are not valid the Deployment is not changed
    Given a credential Secret "proxy-credentials" with metadata:
      """
      labels:
        coder.com/credential: "true"
      annotations:
        coder.com/credential-destinations: "{origin}"
      """
    And the sample provisioner is Ready
    # checks: none
    Then the provisioner pod template is remembered
    When the provisioner spec is changed to:
      """
      image: example.com/coder:changed
      replicas: 2
      extraEnv:
        - name: PROXY_PASSWORD
          valueFrom:
            secretKeyRef:
              name: not-created-yet
              key: value
      """
    # checks: none
    Then the provisioner has condition "CredentialsReady" "False" with reason "CredentialSecretNotFound"
    # checks: R-CRED-8, D-1
    And the provisioner Deployment stays unchanged during the observation window
    # checks: R-CRED-8
    And the provisioner is still Ready

  @R-CRED-12 @R-KEY-15 @D-1 @extended
  Scenario: A control plane that moves to another origin needs the Secrets cleared again
    Given a credential Secret "proxy-credentials" with metadata:
      """
      labels:
        coder.com/credential: "true"
      annotations:
        coder.com/credential-destinations: "{origin}"
      """
    And the sample provisioner is applied with spec:
      """
      extraEnv:
        - name: PROXY_PASSWORD
          valueFrom:
            secretKeyRef:
              name: proxy-credentials
              key: value
      """
    # checks: none
    Then the provisioner becomes Ready
    # checks: none
    And the provisioner pod template is remembered
    When the control plane status is changed to:
      """
      url: "{other origin}"
      """
    # checks: R-CRED-12
    Then the provisioner has condition "CredentialsReady" "False" with reason "CredentialDestinationMismatch"
    # checks: R-CRED-12, D-1
    And the provisioner Deployment stays unchanged during the observation window
    When the credential Secret "proxy-credentials" metadata is changed to:
      """
      annotations:
        coder.com/credential-destinations: "{origin}, {other origin}"
      """
    # checks: R-CRED-12
    Then the provisioner has condition "CredentialsReady" "True" with reason "CredentialsValid"
    # checks: R-CRED-12
    And the provisioner container's env is:
      | name                         | value           | secret                            |
      | CODER_URL                    | {other origin}  |                                   |
      | CODER_PROVISIONER_DAEMON_KEY |                 | {provisioner}-provisioner-key/key |
      | PROXY_PASSWORD               |                 | proxy-credentials/value           |
    # checks: R-KEY-15
    And coderd saw exactly 2 POST on "provisionerkeys"
