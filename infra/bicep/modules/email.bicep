// Azure Communication Services with an Azure-managed email domain: the completion emails.

param prefix string
param suffix string
@description('Where the data of the communication services is kept.')
param dataLocation string
@description('Local part of the sender address, at the managed domain.')
param senderUsername string

resource emailService 'Microsoft.Communication/emailServices@2023-04-01' = {
  name: '${prefix}-email-${suffix}'
  location: 'global'
  properties: { dataLocation: dataLocation }
}

resource domain 'Microsoft.Communication/emailServices/domains@2023-04-01' = {
  parent: emailService
  name: 'AzureManagedDomain'
  location: 'global'
  properties: { domainManagement: 'AzureManaged', userEngagementTracking: 'Disabled' }
}

resource sender 'Microsoft.Communication/emailServices/domains/senderUsernames@2023-04-01' = {
  parent: domain
  name: senderUsername
  properties: { username: senderUsername, displayName: 'bagpipe' }
}

resource communication 'Microsoft.Communication/communicationServices@2023-04-01' = {
  name: '${prefix}-acs-${suffix}'
  location: 'global'
  properties: {
    dataLocation: dataLocation
    linkedDomains: [ domain.id ]
  }
}

output id string = communication.id
output endpoint string = 'https://${communication.properties.hostName}'
output sender string = '${senderUsername}@${domain.properties.mailFromSenderDomain}'
